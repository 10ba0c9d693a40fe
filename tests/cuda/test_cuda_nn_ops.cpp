// CPU-vs-CUDA checks of the transformer op families (embedding, rmsnorm, rope, swiglu, cross
// entropy) and the optimizer ops, forward and backward, in float32 and bfloat16 (see
// op_harness.h). Reductions that must be deterministic are also run twice with the same inputs
// and compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/embedding.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/ops/rmsnorm.h"
#include "meshtrain/ops/rope.h"
#include "meshtrain/ops/swiglu.h"
#include "op_harness.h"

namespace meshtrain::cudatest {
namespace {

using V = std::vector<ValueId>;
const DType kTrainDtypes[] = {DType::kF32, DType::kBF16};

void expect_reproducible(const OpCase& c) {
  std::vector<std::vector<double>> a, b;
  const uint64_t seed = fresh_seed();
  run_case(c, seed, &a);
  run_case(c, seed, &b);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(a[i] == b[i]) << c.name << ": GPU tensor " << i
                              << " differs between two runs on the same inputs (seed " << seed
                              << ")";
}

OpCase embedding_case(DType dt, int64_t v, int64_t d, Shape ids) {
  InputSpec id_spec{ids, DType::kI32};
  id_spec.int_lo = 0, id_spec.int_hi = v;
  return {.name = fmt::format("embedding/{}/V={}/D={}/ids{}", dtype_name(dt), v, d, ids),
          .inputs = {id_spec, {Shape{v, d}, dt}},
          .build = [](Builder& b, const V& x) { return V{ops::embedding(b, x[0], x[1])}; }};
}

// Repeated ids (V < tokens), unused rows (V > tokens), a vocabulary that needs five 4-bit sort
// passes, and an odd D (no vector copies).
MT_CUDA_CASE_TEST(CudaNnOps, EmbeddingForwardBackward, "embedding", "embedding_backward") {
  for (DType dt : kTrainDtypes) {
    expect_case(embedding_case(dt, 50, 64, Shape{4, 37}));
    expect_case(embedding_case(dt, 700, 24, Shape{300}));
    expect_case(embedding_case(dt, 70000, 8, Shape{2, 74}));
    expect_case(embedding_case(dt, 33, 13, Shape{3, 100}));
  }
}

TEST(CudaNnOps, EmbeddingBackwardIsBitwiseReproducible) {
  expect_reproducible(embedding_case(DType::kF32, 40, 96, Shape{8, 256}));
}

OpCase rmsnorm_case(DType dt, Shape x) {
  const int64_t d = x.last();
  return {.name = fmt::format("rmsnorm/{}/{}", dtype_name(dt), x),
          .inputs = {{x, dt}, {Shape{d}, dt, true, 0.5, 1.5}},
          .build = [](Builder& b, const V& v) { return V{ops::rmsnorm(b, v[0], v[1], 1e-5)}; }};
}

MT_CUDA_CASE_TEST(CudaNnOps, RmsNormForwardBackward, "rmsnorm", "rmsnorm_backward") {
  for (DType dt : kTrainDtypes) {
    expect_case(rmsnorm_case(dt, Shape{3, 40, 256}));  // vector accesses
    expect_case(rmsnorm_case(dt, Shape{77, 37}));      // odd D: scalar accesses
    expect_case(rmsnorm_case(dt, Shape{2048, 64}));    // many row groups for dw
  }
}

TEST(CudaNnOps, RmsNormBackwardIsBitwiseReproducible) {
  expect_reproducible(rmsnorm_case(DType::kF32, Shape{1000, 128}));
}

ops::RopeConfig rope_config(const std::string& scaling) {
  ops::RopeConfig c;
  c.scaling = scaling;
  c.theta = scaling == "yarn" ? 10000.0 : 500000.0;
  c.original_seq_len = 8;  // yarn: shorter than the table, so the correction applies
  return c;
}

MT_CUDA_CASE_TEST(CudaNnOps, RopeTable, "rope_table") {
  for (const std::string scaling : {"none", "llama3", "yarn"})
    for (DType dt : {DType::kF32, DType::kF64})
      expect_case({.name = fmt::format("rope_table/{}/{}", scaling, dtype_name(dt)),
                   .build =
                       [=](Builder& b, const V&) {
                         return V{ops::rope_table(b, 40, 64, rope_config(scaling), dt)};
                       },
                   .same_dtypes_on_cpu = true,
                   // cos/sin in float64 on both sides, rounded once; the libraries may differ by
                   // one float64 ulp, which rarely survives the rounding.
                   .tol = {1e-6, 1e-7}});
}

// x bf16 with the float32 table llama3 uses, and matching dtypes; forward and inverse; the table
// covers more positions than x uses.
MT_CUDA_CASE_TEST(CudaNnOps, RopeForwardBackward, "rope") {
  for (DType dt : kTrainDtypes)
    for (bool inverse : {false, true})
      for (bool bf16_table : {false, true})
        for (int64_t start : {0, 48}) {  // 48: MLA's window (q_nope copied, the tail rotated)
          if (bf16_table && dt != DType::kBF16) continue;
          expect_case({.name = fmt::format("rope/x {}/table {}/{}/start {}", dtype_name(dt),
                                           bf16_table ? "bfloat16" : "float32",
                                           inverse ? "inverse" : "forward", start),
                       .inputs = {{Shape{2, 16, 3, 32 + start}, dt}},
                       .build =
                           [=](Builder& b, const V& x) {
                             // The table follows x: float64 on the CPU side of float32 cases,
                             // float32 for bf16 x (the CPU side sees float32 x) unless a bf16 table
                             // is under test.
                             const DType xd = b.dtype(x[0]);
                             const DType tdt = xd == DType::kF64                  ? DType::kF64
                                               : bf16_table && xd == DType::kBF16 ? DType::kBF16
                                                                                  : DType::kF32;
                             ValueId t = ops::rope_table(b, 20, 32, rope_config("llama3"), tdt);
                             return V{ops::rope(b, x[0], t, inverse, start)};
                           },
                       // A bf16 table adds its own rounding (2^-9) to every product.
                       .tol = bf16_table ? Tolerance{2e-2, 8e-3} : Tolerance{}});
        }
}

MT_CUDA_CASE_TEST(CudaNnOps, SwigluForwardBackward, "swiglu", "swiglu_backward") {
  for (DType dt : kTrainDtypes)
    for (Shape s : {Shape{64, 300}, Shape{5, 7}}) {
      InputSpec gate{s, dt};
      gate.lo = -12, gate.hi = 12;  // covers the saturated tails of the sigmoid
      expect_case({.name = fmt::format("swiglu/{}/{}", dtype_name(dt), s),
                   .inputs = {gate, {s, dt}},
                   .build = [](Builder& b, const V& x) { return V{ops::swiglu(b, x[0], x[1])}; }});
    }
}

// The labels [n] of a loss over v classes (about one in ten is ignore_index) and its count [1].
std::vector<InputSpec> label_inputs(int64_t n, int64_t v) {
  InputSpec labels{Shape{n}, DType::kI32};
  labels.differentiable = false;
  labels.gen = [v](std::mt19937_64& rng, int64_t) {
    if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) return -100.0;
    return double(std::uniform_int_distribution<int64_t>(0, v - 1)(rng));
  };
  InputSpec count{Shape{1}, DType::kI64};
  count.differentiable = false;
  count.gen = [n](std::mt19937_64&, int64_t) { return double(n + 3); };
  return {labels, count};
}

OpCase cross_entropy_case(DType dt, int64_t n, int64_t v) {
  InputSpec logits{Shape{n, v}, dt};
  logits.lo = -4, logits.hi = 4;
  const std::vector<InputSpec> lc = label_inputs(n, v);
  return {
      .name = fmt::format("cross_entropy/{}/N={}/V={}", dtype_name(dt), n, v),
      .inputs = {logits, lc[0], lc[1]},
      .build = [](Builder& b, const V& x) { return V{ops::cross_entropy(b, x[0], x[1], x[2])}; }};
}

MT_CUDA_CASE_TEST(CudaNnOps, CrossEntropyForwardBackward, "cross_entropy",
                  "cross_entropy_backward") {
  for (DType dt : kTrainDtypes) {
    expect_case(cross_entropy_case(dt, 64, 1000));
    expect_case(cross_entropy_case(dt, 48, 997));   // rows not a multiple of the vector width
    expect_case(cross_entropy_case(dt, 8, 32000));  // long rows, streamed in chunks
  }
}

TEST(CudaNnOps, CrossEntropyLossIsFloat32ForBf16Logits) {
  Graph g;
  Builder b(g);
  ValueId l = b.input("logits", {Shape{4, 10}, DType::kBF16});
  ValueId y = b.input("labels", {Shape{4}, DType::kI32});
  ValueId n = b.input("count", {Shape{1}, DType::kI64});
  EXPECT_EQ(b.dtype(ops::cross_entropy(b, l, y, n)), DType::kF32);
}

TEST(CudaNnOps, CrossEntropyIsBitwiseReproducible) {
  expect_reproducible(cross_entropy_case(DType::kBF16, 256, 5000));
}

// The fused output head and loss against the CPU's (float32 for bf16): loss, and through its
// scale_by backward the gradients of h and w; N not a multiple of chunk_rows.
OpCase linear_cross_entropy_case(DType dt, int64_t n, int64_t d, int64_t v, int64_t chunk) {
  InputSpec h{Shape{n, d}, dt};
  InputSpec w{Shape{v, d}, dt};
  w.lo = -0.1, w.hi = 0.1;
  const std::vector<InputSpec> lc = label_inputs(n, v);
  return {.name = fmt::format("linear_cross_entropy/{}/N={}/D={}/V={}/chunk={}", dtype_name(dt), n,
                              d, v, chunk),
          .inputs = {h, w, lc[0], lc[1]},
          .build = [chunk](Builder& b, const V& x) {
            return V{ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3], true, chunk).loss};
          }};
}

MT_CUDA_CASE_TEST(CudaNnOps, LinearCrossEntropyForwardBackward, "linear_cross_entropy",
                  "scale_by") {
  expect_case(linear_cross_entropy_case(DType::kBF16, 1000, 256, 5000, 384));
  expect_case(linear_cross_entropy_case(DType::kF32, 300, 64, 999, 128));   // odd V: scalar loads
  expect_case(linear_cross_entropy_case(DType::kBF16, 40, 32, 700, 1000));  // one chunk
  expect_reproducible(linear_cross_entropy_case(DType::kBF16, 1000, 256, 5000, 384));
}

MT_CUDA_CASE_TEST(CudaNnOps, SumSquares, "sum_squares") {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64})
    expect_case({.name = fmt::format("sum_squares/{}", dtype_name(dt)),
                 .inputs = {{Shape{300007}, dt}},
                 .build = [](Builder& b, const V& x) { return V{ops::sum_squares(b, x[0])}; },
                 .backward = false,
                 // float64 sums of positive terms in another order: ~n·1e-16 at worst.
                 .tol = {1e-11, 0}});
}

// accumulate and adamw_update write persistent tensors in place, so they get their own graphs.
std::vector<double> host_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.item_as_double(i);
  return v;
}

Tensor random_host(Shape s, DType dt, std::mt19937_64& rng, double lo, double hi) {
  Tensor t = Tensor::empty(s, dt);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = u(rng);
    switch (dt) {
      case DType::kF32: static_cast<float*>(t.raw())[i] = float(x); break;
      case DType::kF64: static_cast<double*>(t.raw())[i] = x; break;
      case DType::kBF16: static_cast<BFloat16*>(t.raw())[i] = BFloat16(float(x)); break;
      default: ADD_FAILURE() << "random_host: integer dtype";
    }
  }
  return t;
}

MT_CUDA_CASE_TEST(CudaNnOps, AccumulateFloat32FromFloat32AndBf16AddOrOverwrite, "accumulate") {
  Backend& be = cuda_backend();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool overwrite : {false, true})
    for (DType src_dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("accumulate float32 {}= {} (seed {})", overwrite ? "" : "+",
                               dtype_name(src_dt), seed));
      const Shape s{1031, 3};
      Tensor dst0 = random_host(s, DType::kF32, rng, -1, 1);
      Tensor src = random_host(s, src_dt, rng, -1, 1);
      Graph g;
      Builder b(g);
      ValueId d = b.persistent("dst", {s, DType::kF32}, ValueRole::kState);
      ValueId x = b.input("src", {s, src_dt});
      ops::accumulate(b, d, x, overwrite);
      Tensor dd = to_device(be, dst0);
      Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
      ex.bind(d, dd);
      ex.prepare();
      be.copy(ex.tensor(x).raw(), src.raw(), src.nbytes(), CopyKind::kHostToDevice, be.stream(0));
      ex.run();
      ex.run();  // twice: dst += 2 src, or dst = src
      std::vector<double> got = host_values(to_host(be, dd));
      for (int64_t i = 0; i < s.numel(); ++i) {
        const float x_i = float(src.item_as_double(i));
        const float want = overwrite ? x_i : (dst0.data<float>()[i] + x_i) + x_i;
        ASSERT_EQ(float(got[size_t(i)]), want) << "element " << i;
      }
      note_compared_graph(g);
    }
}

// scale_by_accumulate (a sink, like accumulate): float32 dst (+)= x · s for float32 and bf16 x.
MT_CUDA_CASE_TEST(CudaNnOps, ScaleByAccumulateAddOrOverwrite, "scale_by_accumulate") {
  Backend& be = cuda_backend();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool overwrite : {false, true})
    for (DType src_dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("scale_by_accumulate float32 {}= {} (seed {})", overwrite ? "" : "+",
                               dtype_name(src_dt), seed));
      const Shape s{1031, 3};
      Tensor dst0 = random_host(s, DType::kF32, rng, -1, 1);
      Tensor src = random_host(s, src_dt, rng, -1, 1);
      Tensor k = random_host(Shape{1}, DType::kF32, rng, 0.5, 2);
      Graph g;
      Builder b(g);
      ValueId d = b.persistent("dst", {s, DType::kF32}, ValueRole::kState);
      ValueId x = b.input("src", {s, src_dt});
      ValueId sc = b.input("scale", {Shape{1}, DType::kF32});
      ops::scale_by_accumulate(b, d, x, sc, overwrite);
      Tensor dd = to_device(be, dst0);
      Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
      ex.bind(d, dd);
      ex.prepare();
      be.copy(ex.tensor(x).raw(), src.raw(), src.nbytes(), CopyKind::kHostToDevice, be.stream(0));
      be.copy(ex.tensor(sc).raw(), k.raw(), k.nbytes(), CopyKind::kHostToDevice, be.stream(0));
      ex.run();
      std::vector<double> got = host_values(to_host(be, dd));
      const float kf = k.data<float>()[0];
      for (int64_t i = 0; i < s.numel(); ++i) {
        const float y = float(src.item_as_double(i)) * kf;
        const float want = overwrite ? y : y + dst0.data<float>()[i];
        ASSERT_EQ(float(got[size_t(i)]), want) << "element " << i;
      }
      note_compared_graph(g);
    }
}

// The one-node graph of both AdamW cases: a float32 flat group of shape `s`, max_norm 1.
struct AdamWGraph {
  explicit AdamWGraph(const Shape& s) : shape(s) {
    const ops::AdamWParams ap{
        .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_norm = 1.0};
    Builder b(g, NodePhase::kOptimizer);
    lr_slot = g.add_scalar("lr"), step_slot = g.add_scalar("step");
    p = b.persistent("p", {s, DType::kF32}, ValueRole::kParameter);
    gr = b.persistent("g", {s, DType::kF32}, ValueRole::kGradient);
    m = b.persistent("m", {s, DType::kF32}, ValueRole::kState);
    v = b.persistent("v", {s, DType::kF32}, ValueRole::kState);
    nsq = b.persistent("norm_sq", {Shape{1}, DType::kF64}, ValueRole::kState);
    ops::adamw_update(b, p, gr, m, v, nsq, lr_slot, step_slot, ap);
  }
  Shape shape;
  Graph g;
  int lr_slot = -1, step_slot = -1;
  ValueId p = kNoValue, gr = kNoValue, m = kNoValue, v = kNoValue, nsq = kNoValue;
};

// Both sides of one AdamW case: random parameters, gradients and moments on the host (the CPU
// executor's), their device copies (the GPU executor's), the squared gradient norm `norm_sq`, and
// the two executors bound and prepared.
struct AdamWSides {
  AdamWSides(const AdamWGraph& ag, Backend& gpu, Backend& cpu, std::mt19937_64& rng, double norm_sq)
      : hp(random_host(ag.shape, DType::kF32, rng, -1, 1)),
        hg(random_host(ag.shape, DType::kF32, rng, -1, 1)),
        hm(random_host(ag.shape, DType::kF32, rng, -0.1, 0.1)),
        hv(random_host(ag.shape, DType::kF32, rng, 0, 0.01)),
        hn(Tensor::from_vector(std::vector<double>{norm_sq}, Shape{1})),
        dp(to_device(gpu, hp)),
        dg(to_device(gpu, hg)),
        dm(to_device(gpu, hm)),
        dv(to_device(gpu, hv)),
        dn(to_device(gpu, hn)),
        ce(ag.g, plan_memory(ag.g, DeviceType::kCPU), cpu, nullptr),
        ge(ag.g, plan_memory(ag.g, DeviceType::kCUDA), gpu, nullptr) {
    ce.bind(ag.p, hp), ce.bind(ag.gr, hg), ce.bind(ag.m, hm), ce.bind(ag.v, hv);
    ce.bind(ag.nsq, hn);
    ge.bind(ag.p, dp), ge.bind(ag.gr, dg), ge.bind(ag.m, dm), ge.bind(ag.v, dv);
    ge.bind(ag.nsq, dn);
    ce.prepare();
    ge.prepare();
  }
  Tensor hp, hg, hm, hv, hn;  // host: the CPU side
  Tensor dp, dg, dm, dv, dn;  // device: the GPU side
  Executor ce, ge;
};

// One fused AdamW step on the GPU against the CPU kernel, with clipping active (max_norm below
// the gradient norm), then a second step; float32 master weights.
MT_CUDA_CASE_TEST(CudaNnOps, AdamWMatchesCpu, "adamw_update") {
  Backend& gpu = cuda_backend();
  auto cpu = create_backend("cpu", 0);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const Shape s{5003};
  AdamWGraph ag(s);
  AdamWSides sides(ag, gpu, *cpu, rng, 37.5);  // norm 6.12 > max_norm
  Tensor &hp = sides.hp, &hg = sides.hg, &hm = sides.hm, &hv = sides.hv;
  Tensor &dp = sides.dp, &dg = sides.dg, &dm = sides.dm, &dv = sides.dv;
  Tensor g2 = random_host(s, DType::kF32, rng, -1, 1);
  for (int step = 1; step <= 2; ++step) {
    for (Executor* e : {&sides.ce, &sides.ge}) {
      e->set_scalar(ag.lr_slot, 3e-3 * step);
      e->set_scalar(ag.step_slot, step);
      e->run();
    }
    // The gradient was reset to zero; load the next one on both sides.
    EXPECT_EQ(host_values(to_host(gpu, dg)), std::vector<double>(size_t(s.numel()), 0.0))
        << "step " << step;
    hg.copy_from_host(g2);
    gpu.copy(dg.raw(), g2.raw(), g2.nbytes(), CopyKind::kHostToDevice, gpu.stream(0));
  }
  const char* names[] = {"param", "exp_avg", "exp_avg_sq"};
  const Tensor* host[] = {&hp, &hm, &hv};
  const Tensor* dev[] = {&dp, &dm, &dv};
  for (int k = 0; k < 3; ++k) {
    std::vector<double> want = host_values(*host[k]), got = host_values(to_host(gpu, *dev[k]));
    for (size_t i = 0; i < want.size(); ++i)
      // Absolute part at float32 rounding of the operands (|m|, |g| <= 1): the moment update
      // m + (g - m)(1 - b1) cancels, and the GPU contracts it into FMAs.
      ASSERT_NEAR(got[i], want[i], 2e-6 * std::abs(want[i]) + 1e-8) << names[k] << "[" << i << "]";
  }
  note_compared_graph(ag.g);
}

// A NaN or Inf squared norm skips the update on the GPU as on the CPU: parameters and moments keep
// their bits, the gradient is reset ([training] skip_nonfinite_steps relies on it).
MT_CUDA_CASE_TEST(CudaNnOps, AdamWSkipsOnNonFiniteNorm, "adamw_update") {
  Backend& gpu = cuda_backend();
  auto cpu = create_backend("cpu", 0);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const Shape s{4099};
  AdamWGraph ag(s);
  for (double bad : {std::nan(""), double(INFINITY)}) {
    AdamWSides sides(ag, gpu, *cpu, rng, bad);
    const Tensor &hp = sides.hp, &hg = sides.hg, &hm = sides.hm, &hv = sides.hv;
    const Tensor &dp = sides.dp, &dg = sides.dg, &dm = sides.dm, &dv = sides.dv;
    const std::vector<double> p0 = host_values(hp), m0 = host_values(hm), v0 = host_values(hv);
    for (Executor* e : {&sides.ce, &sides.ge}) {
      e->set_scalar(ag.lr_slot, 3e-3);
      e->set_scalar(ag.step_slot, 1);
      e->run();
    }
    const std::vector<double> zeros(size_t(s.numel()), 0.0);
    EXPECT_EQ(host_values(to_host(gpu, dg)), zeros) << "norm_sq " << bad;
    EXPECT_EQ(host_values(hg), zeros) << "norm_sq " << bad;
    EXPECT_EQ(host_values(to_host(gpu, dp)), p0) << "norm_sq " << bad;
    EXPECT_EQ(host_values(to_host(gpu, dm)), m0) << "norm_sq " << bad;
    EXPECT_EQ(host_values(to_host(gpu, dv)), v0) << "norm_sq " << bad;
    EXPECT_EQ(host_values(hp), p0) << "norm_sq " << bad;
    EXPECT_EQ(host_values(hm), m0) << "norm_sq " << bad;
    EXPECT_EQ(host_values(hv), v0) << "norm_sq " << bad;
  }
  note_compared_graph(ag.g);
}

}  // namespace
}  // namespace meshtrain::cudatest
