// Compute copies under mixed precision, exercised on the CPU with float64 masters and float32
// compute: the plan gives each trainable weight a persistent copy that the forward reads (no cast
// of a master left in the step graph), float32 runs keep today's graph, AdamW writes the copy in
// its pass with the cast's rounding (and leaves it on a skipped step), cast_into refreshes it, and
// ParamStore keeps it equal to cast(master). Whole runs: tests/unit/test_compute_copies_runs.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

const std::vector<std::string> kMixed = {"--training.master_dtype", "float64",
                                         "--training.mixed_precision_param", "float32"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<StepGraph> step_graph(const std::vector<std::string>& overrides) {
  const JobConfig cfg = testing::tiny_job(overrides);
  StepGraphOptions o{.tokenizer_vocab = 258,
                     .compute_dtype = cfg.training.mixed_precision_param.value_or(DType::kF32),
                     .master_dtype = cfg.training.master_dtype,
                     .reduce_dtype = cfg.training.mixed_precision_reduce};
  return build_step_graph(cfg, nullptr, o);
}

const std::vector<std::string> kDeepSeek = {"--model.name", "deepseek_v3",      "--model.flavor",
                                            "debugmodel",   "--model.n_layers", "2"};

// Live nodes whose op is `cast` and whose input is a master (a persistent parameter).
int casts_of_masters(const Graph& g) {
  int n = 0;
  for (NodeId id : g.schedule()) {
    const Node& node = g.node(id);
    if (node.op == "cast" && g.value(node.inputs[0]).role == ValueRole::kParameter) ++n;
  }
  return n;
}

TEST(ComputeCopies, MixedPrecisionForwardReadsCopiesAndCastsNoMaster) {
  for (const auto& model : {std::vector<std::string>{}, kDeepSeek}) {
    auto sg = step_graph(cat(model, kMixed));
    const Graph& g = sg->graph;
    const auto consumers = g.consumers();
    int64_t copy_bytes = 0;
    int copies = 0;
    for (const ParamInfo& p : sg->plan->params()) {
      if (!p.trainable) {
        EXPECT_EQ(p.compute, kNoValue) << p.name << ": state keeps no copy";
        continue;
      }
      ASSERT_NE(p.compute, kNoValue) << p.name;
      ++copies;
      const Value& c = g.value(p.compute);
      EXPECT_EQ(c.role, ValueRole::kComputeCopy) << p.name;
      EXPECT_EQ(c.meta, (TensorMeta{p.local_shape, DType::kF32})) << p.name;
      EXPECT_EQ(c.name, p.name + ".compute");
      EXPECT_FALSE(consumers[size_t(p.compute)].empty()) << p.name << ": the forward reads it";
      EXPECT_TRUE(consumers[size_t(p.master)].empty()) << p.name << ": nothing reads the master";
      EXPECT_EQ(p.weight(), p.compute);
      copy_bytes += int64_t(c.meta.nbytes());
    }
    EXPECT_GT(copies, 3);
    EXPECT_EQ(casts_of_masters(g), 0);
    const MemoryPlan mp = plan_memory(g, DeviceType::kCPU);
    EXPECT_EQ(mp.compute_copy_bytes, copy_bytes);
    EXPECT_EQ(mp.total_bytes(), mp.arena_bytes + mp.input_bytes + mp.parameter_bytes + copy_bytes +
                                    mp.gradient_bytes + mp.state_bytes);
    EXPECT_CONTAINS(mp.summary(), "+ compute copies");

    // The cast path: every master cast in the forward, no copies, and more arena (the casts).
    auto cast = step_graph(cat(cat(model, kMixed), {"--training.compute_weight_copies", "false"}));
    for (const ParamInfo& p : cast->plan->params()) EXPECT_EQ(p.compute, kNoValue) << p.name;
    EXPECT_EQ(casts_of_masters(cast->graph), copies);
    const MemoryPlan cmp = plan_memory(cast->graph, DeviceType::kCPU);
    EXPECT_EQ(cmp.compute_copy_bytes, 0);
    EXPECT_GT(cmp.arena_bytes, mp.arena_bytes) << "the cast outputs live in the arena";
  }
}

TEST(ComputeCopies, SameDtypeRunsKeepTheirGraph) {
  // float32 (and float64) runs have nothing to copy: the key changes no node, value or plan.
  for (const auto& dtypes :
       {std::vector<std::string>{},
        std::vector<std::string>{"--training.master_dtype", "float64",
                                 "--training.mixed_precision_param", "float64"}}) {
    auto on = step_graph(cat(kDeepSeek, dtypes));
    auto off =
        step_graph(cat(cat(kDeepSeek, dtypes), {"--training.compute_weight_copies", "false"}));
    EXPECT_EQ(on->graph.dump(), off->graph.dump());
    for (const ParamInfo& p : on->plan->params()) EXPECT_EQ(p.compute, kNoValue) << p.name;
    const MemoryPlan mp = plan_memory(on->graph, DeviceType::kCPU);
    EXPECT_EQ(mp.compute_copy_bytes, 0);
    EXPECT_EQ(mp.summary().find("compute copies"), std::string::npos);
  }
}

// One AdamW node over a flat group: master (dtype m), grad, moments, norm, and optionally the
// compute copy (dtype c).
struct AdamWCase {
  AdamWCase(const Shape& s, DType m, std::optional<DType> c) {
    Builder b(g, NodePhase::kOptimizer);
    lr = g.add_scalar("lr"), step = g.add_scalar("step");
    p = b.persistent("p", {s, m}, ValueRole::kParameter);
    gr = b.persistent("g", {s, m}, ValueRole::kGradient);
    m1 = b.persistent("m", {s, m}, ValueRole::kState);
    v1 = b.persistent("v", {s, m}, ValueRole::kState);
    nsq = b.persistent("norm_sq", {Shape{1}, DType::kF64}, ValueRole::kState);
    if (c) copy = b.persistent("copy", {s, *c}, ValueRole::kComputeCopy);
    ops::adamw_update(b, p, gr, m1, v1, nsq, lr, step,
                      {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}, copy);
  }
  Graph g;
  int lr = -1, step = -1;
  ValueId p = kNoValue, gr = kNoValue, m1 = kNoValue, v1 = kNoValue, nsq = kNoValue,
          copy = kNoValue;
};

Tensor random_tensor(const Shape& s, DType dt, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(s, dt);
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double x = u(rng);
    if (dt == DType::kF32) t.data<float>()[i] = float(x);
    if (dt == DType::kF64) t.data<double>()[i] = x;
  }
  return t;
}

Tensor cast_on_host(const Tensor& x, DType to) {
  Graph g;
  Builder b(g);
  ValueId in = b.persistent("x", {x.shape(), x.dtype()}, ValueRole::kParameter);
  ValueId out = b.persistent("y", {x.shape(), to}, ValueRole::kComputeCopy);
  ops::cast_into(b, out, in);
  auto cpu = create_backend("cpu", 0);
  Tensor y = Tensor::empty(x.shape(), to);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *cpu, nullptr);
  ex.bind(in, x);
  ex.bind(out, y);
  ex.prepare();
  ex.run();
  return y;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(ComputeCopies, CastIntoRoundsLikeTheCastOp) {
  // float64 -> float32 and float32 -> bfloat16 (round to nearest even, ties included).
  std::mt19937_64 rng(std::random_device{}());
  Tensor d = random_tensor(Shape{1000}, DType::kF64, rng, -3, 3);
  Tensor f = cast_on_host(d, DType::kF32);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(f.data<float>()[i], float(d.data<double>()[i]));
  Tensor ties = Tensor::from_vector(
      std::vector<float>{1.00390625f, 1.01171875f, -2.0078125f, 3.1415927f}, Shape{4});
  Tensor h = cast_on_host(ties, DType::kBF16);
  const uint16_t want[] = {0x3f80, 0x3f82, 0xc000, 0x4049};  // ties go to the even mantissa
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.data<BFloat16>()[i].bits, want[i]) << i;
}

// AdamW with a copy: the same master and moments as without, and copy = cast(updated master);
// a non-finite norm leaves every tensor, the copy included.
TEST(ComputeCopies, AdamWWritesTheCastOfTheUpdatedMasterInTheSamePass) {
  auto cpu = create_backend("cpu", 0);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const Shape s{777};
  for (auto [m, c] : {std::pair{DType::kF64, DType::kF32}, std::pair{DType::kF32, DType::kBF16}})
    for (double norm_sq : {37.5, double(NAN)}) {
      SCOPED_TRACE(fmt::format("{} master, {} copy, norm_sq {}", m, c, norm_sq));
      AdamWCase with(s, m, c), without(s, m, std::nullopt);
      const Tensor p0 = random_tensor(s, m, rng, -1, 1), g0 = random_tensor(s, m, rng, -1, 1),
                   m0 = random_tensor(s, m, rng, -0.1, 0.1), v0 = random_tensor(s, m, rng, 0, 0.01);
      const Tensor n = Tensor::from_vector(std::vector<double>{norm_sq}, Shape{1});
      auto run = [&](AdamWCase& k, Tensor copy) {
        std::vector<Tensor> t;
        for (const Tensor* x : {&p0, &g0, &m0, &v0}) {
          t.push_back(Tensor::empty(s, m));
          t.back().copy_from_host(*x);
        }
        Executor ex(k.g, plan_memory(k.g, DeviceType::kCPU), *cpu, nullptr);
        ex.bind(k.p, t[0]), ex.bind(k.gr, t[1]), ex.bind(k.m1, t[2]), ex.bind(k.v1, t[3]);
        ex.bind(k.nsq, n);
        if (k.copy != kNoValue) ex.bind(k.copy, copy);
        ex.prepare();
        ex.set_scalar(k.lr, 3e-3);
        ex.set_scalar(k.step, 2);
        ex.run();
        return t;
      };
      Tensor copy = cast_on_host(p0, c);  // the invariant the store keeps before a step
      const Tensor copy0 = cast_on_host(p0, c);
      const std::vector<Tensor> a = run(with, copy), b = run(without, Tensor());
      for (int k = 0; k < 4; ++k) EXPECT_TRUE(same_bytes(a[size_t(k)], b[size_t(k)])) << k;
      EXPECT_TRUE(same_bytes(copy, cast_on_host(a[0], c)));
      if (std::isnan(norm_sq)) {
        EXPECT_TRUE(same_bytes(a[0], p0)) << "a skipped step leaves the master";
        EXPECT_TRUE(same_bytes(copy, copy0)) << "and its copy";
      } else {
        EXPECT_FALSE(same_bytes(copy, copy0)) << "the update moved the copy";
      }
    }
}

// ParamStore: the copies follow the masters after initialize and after masters_written + sync;
// without the sync they stay as they were (the trainer syncs before each step).
TEST(ComputeCopies, StoreCastsMastersIntoCopiesWhenTold) {
  auto sg = step_graph(cat(kDeepSeek, kMixed));
  auto cpu = create_backend("cpu", 0);
  ParamStore store(*sg->plan, *cpu);
  EXPECT_TRUE(store.has_compute_copies());
  store.initialize(5);
  auto check = [&](bool want_equal) {
    for (const ParamInfo& p : sg->plan->params()) {
      if (p.compute == kNoValue) continue;
      const bool eq =
          same_bytes(store.compute_copy(p.name), cast_on_host(store.master(p.name), DType::kF32));
      EXPECT_EQ(eq, want_equal) << p.name;
    }
  };
  check(true);
  for (const ParamGroup& g : store.groups()) {
    ASSERT_TRUE(g.has_compute);
    EXPECT_EQ(g.compute.dtype(), DType::kF32);
    EXPECT_EQ(g.compute.numel(), g.master.numel());
    double* m = g.master.data<double>();
    for (int64_t i = 0; i < g.master.numel(); ++i) m[i] = m[i] * 0.5 + 0.25;
  }
  store.sync_compute_copies();  // not told: a no-op
  check(false);
  store.masters_written();
  store.sync_compute_copies();
  check(true);
  int64_t params = 0, copies = 0;
  for (const ParamGroup& g : store.groups())
    params += g.master.nbytes() * 4, copies += g.compute.nbytes();
  int64_t state = 0;
  for (const ParamInfo& p : sg->plan->params())
    if (!p.trainable) state += int64_t(store.master(p.name).nbytes());
  EXPECT_EQ(store.bytes(), params + copies + state);
  EXPECT_THROW(store.compute_copy(sg->plan->load_balance_layers().at(0).expert_bias), Error);
}

}  // namespace
}  // namespace meshtrain
