// The compute-copy kernels on the GPU against the CPU: cast_into converts bit for bit as the CPU
// does (bfloat16 rounded to nearest even), and AdamW with a compute copy (bf16 of float32 masters,
// float32 of float64 ones) leaves master, moments and gradient bitwise as the kernel without one,
// writes the copy as the cast of the updated master bit for bit, agrees with the CPU kernel within
// the AdamW tolerance, and keeps the copy on a skipped step (non-finite norm).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include "cuda_test_util.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "op_harness.h"

namespace meshtrain::cudatest {
namespace {

Tensor random_host(const Shape& s, DType dt, std::mt19937_64& rng, double lo, double hi) {
  Tensor t = Tensor::empty(s, dt);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = u(rng);
    switch (dt) {
      case DType::kF32: t.data<float>()[i] = float(x); break;
      case DType::kF64: t.data<double>()[i] = x; break;
      case DType::kBF16: t.data<BFloat16>()[i] = BFloat16(float(x)); break;
      default: ADD_FAILURE() << "random_host: integer dtype";
    }
  }
  return t;
}

// The CPU cast kernel's conversion, on the host.
Tensor cast_host(const Tensor& x, DType to) {
  Tensor y = Tensor::empty(x.shape(), to);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.item_as_double(i);
    if (to == DType::kBF16) y.data<BFloat16>()[i] = BFloat16(float(v));
    if (to == DType::kF32) y.data<float>()[i] = float(v);
    if (to == DType::kF64) y.data<double>()[i] = v;
  }
  return y;
}

Tensor host_clone(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  std::memcpy(y.raw(), x.raw(), x.nbytes());
  return y;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

MT_CUDA_CASE_TEST(CudaComputeCopies, CastIntoMatchesCpuBitwise, "cast_into") {
  Backend& gpu = cuda_backend();
  auto cpu = create_backend("cpu", 0);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::pair<DType, DType> pairs[] = {{DType::kF32, DType::kBF16},
                                           {DType::kF64, DType::kF32},
                                           {DType::kF64, DType::kBF16},
                                           {DType::kBF16, DType::kF32}};
  for (auto [from, to] : pairs) {
    SCOPED_TRACE(fmt::format("{} -> {} (seed {})", from, to, seed));
    const Shape s{4099};  // odd: the vector loop's scalar tail too
    Tensor src = random_host(s, from, rng, -4, 4);
    if (from == DType::kF32) {
      // Exact halfway cases between two bf16 values: ties go to the even mantissa.
      for (int i = 0; i < 64; ++i) {
        uint32_t u = 0x3f800000u + (uint32_t(i) << 16) + 0x8000u;
        std::memcpy(src.data<float>() + i, &u, 4);
      }
    }
    Graph g;
    Builder b(g, NodePhase::kOptimizer);
    ValueId x = b.persistent("src", {s, from}, ValueRole::kParameter);
    ValueId y = b.persistent("dst", {s, to}, ValueRole::kComputeCopy);
    ops::cast_into(b, y, x);
    Tensor hy = Tensor::empty(s, to), dx = to_device(gpu, src), dy = to_device(gpu, hy);
    poison(dy.raw(), dy.nbytes(), gpu.stream(0));
    Executor ce(g, plan_memory(g, DeviceType::kCPU), *cpu, nullptr),
        ge(g, plan_memory(g, DeviceType::kCUDA), gpu, nullptr);
    ce.bind(x, src), ce.bind(y, hy);
    ge.bind(x, dx), ge.bind(y, dy);
    ce.prepare();
    ge.prepare();
    ce.run();
    ge.run();
    EXPECT_TRUE(same_bytes(to_host(gpu, dy), hy));
    EXPECT_TRUE(same_bytes(hy, cast_host(src, to)));
    note_compared_graph(g);
  }
}

// One AdamW node: master dtype m, optionally a compute copy of dtype c.
struct AdamWGraph {
  AdamWGraph(const Shape& s, DType m, std::optional<DType> c) {
    Builder b(g, NodePhase::kOptimizer);
    lr_slot = g.add_scalar("lr"), step_slot = g.add_scalar("step");
    v[0] = b.persistent("p", {s, m}, ValueRole::kParameter);
    v[1] = b.persistent("g", {s, m}, ValueRole::kGradient);
    v[2] = b.persistent("m", {s, m}, ValueRole::kState);
    v[3] = b.persistent("v", {s, m}, ValueRole::kState);
    nsq = b.persistent("norm_sq", {Shape{1}, DType::kF64}, ValueRole::kState);
    if (c) copy = b.persistent("copy", {s, *c}, ValueRole::kComputeCopy);
    ops::adamw_update(
        b, v[0], v[1], v[2], v[3], nsq, lr_slot, step_slot,
        {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_norm = 1.0}, copy);
  }
  // Runs one step (lr 3e-3, step 2) over copies of `state` (p, g, m, v) on `be`; returns them
  // (on the host) and the copy (if any) after the step.
  std::vector<Tensor> run(Backend& be, const std::vector<Tensor>& state, const Tensor& norm_sq,
                          const Tensor& copy0) {
    const bool dev = be.device().is_cuda();
    std::vector<Tensor> t;
    for (const Tensor& x : state) t.push_back(dev ? to_device(be, x) : host_clone(x));
    Tensor n = dev ? to_device(be, norm_sq) : host_clone(norm_sq);
    Tensor c = copy != kNoValue ? (dev ? to_device(be, copy0) : host_clone(copy0)) : Tensor();
    Executor ex(g, plan_memory(g, be.device().type), be, nullptr);
    for (int k = 0; k < 4; ++k) ex.bind(v[k], t[size_t(k)]);
    ex.bind(nsq, n);
    if (copy != kNoValue) ex.bind(copy, c);
    ex.prepare();
    ex.set_scalar(lr_slot, 3e-3);
    ex.set_scalar(step_slot, 2);
    ex.run();
    if (copy != kNoValue) t.push_back(c);
    if (dev)
      for (Tensor& x : t) x = to_host(be, x);
    return t;
  }
  Graph g;
  int lr_slot = -1, step_slot = -1;
  ValueId v[4] = {kNoValue, kNoValue, kNoValue, kNoValue};
  ValueId nsq = kNoValue, copy = kNoValue;
};

MT_CUDA_CASE_TEST(CudaComputeCopies, AdamWWritesTheCastOfTheUpdatedMaster, "adamw_update") {
  Backend& gpu = cuda_backend();
  auto cpu = create_backend("cpu", 0);
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const Shape s{5003};
  const std::pair<DType, DType> pairs[] = {{DType::kF32, DType::kBF16}, {DType::kF64, DType::kF32}};
  for (auto [m, c] : pairs)
    for (double norm_sq : {37.5, double(NAN)}) {
      SCOPED_TRACE(fmt::format("{} master, {} copy, norm_sq {} (seed {})", m, c, norm_sq, seed));
      AdamWGraph with(s, m, c), without(s, m, std::nullopt);
      const std::vector<Tensor> state = {
          random_host(s, m, rng, -1, 1), random_host(s, m, rng, -1, 1),
          random_host(s, m, rng, -0.1, 0.1), random_host(s, m, rng, 0, 0.01)};
      const Tensor n = Tensor::from_vector(std::vector<double>{norm_sq}, Shape{1});
      const Tensor copy0 = cast_host(state[0], c);  // the store's invariant before a step
      const std::vector<Tensor> a = with.run(gpu, state, n, copy0);
      const std::vector<Tensor> b = without.run(gpu, state, n, Tensor());
      const std::vector<Tensor> h = with.run(*cpu, state, n, copy0);
      const char* names[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
      for (int k = 0; k < 4; ++k)
        EXPECT_TRUE(same_bytes(a[size_t(k)], b[size_t(k)]))
            << names[k] << ": the copy must not change the update";
      EXPECT_TRUE(same_bytes(a[4], cast_host(a[0], c))) << "copy = cast(updated master)";
      if (std::isnan(norm_sq)) {
        EXPECT_TRUE(same_bytes(a[0], state[0])) << "a skipped step keeps the master";
        EXPECT_TRUE(same_bytes(a[4], copy0)) << "and its copy";
        EXPECT_TRUE(same_bytes(h[4], copy0)) << "on the CPU too";
      } else {
        // The CPU's update differs from the GPU's by FMA contraction (see AdamWMatchesCpu); its
        // copy is then the same or one unit in the last place of the compute dtype away.
        const double ulp = c == DType::kBF16 ? 1.0 / 128 : 1.0 / (1 << 23);
        for (int64_t i = 0; i < s.numel(); ++i) {
          const double want = h[4].item_as_double(i), got = a[4].item_as_double(i);
          ASSERT_LE(std::abs(got - want), ulp * std::abs(want) + 1e-30) << "copy[" << i << "]";
        }
      }
      note_compared_graph(with.g);
    }
}

}  // namespace
}  // namespace meshtrain::cudatest
