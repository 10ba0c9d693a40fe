// matmul_accumulate on CUDA (the weight-gradient GEMM writing its fp32 gradient buffer, beta 0 or
// 1) against a float64 CPU reference of the same bf16 operands, in both transposition forms the
// backward of a linear layer produces, with odd extents; overwrite leaves no trace of the old
// destination, accumulate adds exactly once per run, and two runs are bitwise repeatable. The same
// for grouped_matmul_wgrad_accumulate (the routed experts' weight gradients), with an expert that
// received no rows (zeroed when overwriting, untouched when accumulating) and unused NaN rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/ops/matmul.h"
#include "op_harness.h"

namespace meshtrain::cudatest {
namespace {

Tensor random_bf16(const Shape& s, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(s, DType::kBF16);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<BFloat16>()[i] = BFloat16(float(u(rng)));
  return t;
}

struct Form {
  bool ta, tb;
  int64_t m, n, k;
};

// Runs the sink graph twice from dst0 with the host inputs copied in (bindings are fixed at
// prepare: one executor per call) and returns the destination.
Tensor run_twice(Backend& be, const Graph& g, ValueId d, const Tensor& dst0,
                 const std::vector<std::pair<ValueId, const Tensor*>>& inputs) {
  Tensor dd = to_device(be, dst0);
  Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
  ex.bind(d, dd);
  ex.prepare();
  for (const auto& [v, t] : inputs)
    be.copy(ex.tensor(v).raw(), t->raw(), t->nbytes(), CopyKind::kHostToDevice, be.stream(0));
  ex.run();
  ex.run();
  return to_host(be, dd);
}

MT_CUDA_CASE_TEST(CudaGradGemm, MatmulAccumulateBf16IntoFloat32, "matmul_accumulate") {
  Backend& be = cuda_backend();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // dW = Gᵀ X (ta: the linear weight's gradient) and op(A)ᵀ G without transposes; odd extents.
  for (const Form f : {Form{true, false, 257, 129, 999}, Form{false, false, 96, 200, 1031}})
    for (bool overwrite : {false, true}) {
      SCOPED_TRACE(fmt::format("ta {} m {} n {} k {} overwrite {} (seed {})", f.ta, f.m, f.n, f.k,
                               overwrite, seed));
      const Shape as = f.ta ? Shape{f.k, f.m} : Shape{f.m, f.k}, bs{f.k, f.n};
      Tensor a = random_bf16(as, rng), b = random_bf16(bs, rng);
      Tensor dst0 = Tensor::empty(Shape{f.m, f.n}, DType::kF32);
      std::uniform_real_distribution<double> u(-4, 4);
      for (int64_t i = 0; i < dst0.numel(); ++i) dst0.data<float>()[i] = float(u(rng));
      Graph g;
      Builder bld(g, NodePhase::kBackward);
      ValueId d = bld.persistent("dst", {Shape{f.m, f.n}, DType::kF32}, ValueRole::kGradient);
      ValueId va = bld.input("a", {as, DType::kBF16}), vb = bld.input("b", {bs, DType::kBF16});
      ops::matmul_accumulate(bld, d, va, vb, f.ta, f.tb, overwrite);
      const auto run = [&] { return run_twice(be, g, d, dst0, {{va, &a}, {vb, &b}}); };
      Tensor got = run();
      const double u32 = std::ldexp(1.0, -24);
      int bad = 0;
      for (int64_t i = 0; i < f.m && bad < 5; ++i)
        for (int64_t j = 0; j < f.n && bad < 5; ++j) {
          double p = 0, terms = 0;
          for (int64_t t = 0; t < f.k; ++t) {
            const double x = float(a.data<BFloat16>()[f.ta ? t * f.m + i : i * f.k + t]);
            const double y = float(b.data<BFloat16>()[t * f.n + j]);
            p += x * y;
            terms += std::abs(x * y);
          }
          const double old = dst0.data<float>()[i * f.n + j];
          const double want = overwrite ? p : old + 2 * p;
          // Products of bf16 values are exact in fp32; the sum of k of them rounds at most
          // k times (u·k·Σ|terms|), each of the two additions into dst once more.
          const double tol = 2 * u32 * double(f.k) * terms + 4 * u32 * (std::abs(old) + 2 * terms);
          const double v = got.data<float>()[i * f.n + j];
          if (!(std::abs(v - want) <= tol)) {
            ++bad;
            ADD_FAILURE() << "element " << i << "," << j << ": got " << v << ", want " << want
                          << " (tolerance " << tol << ")";
          }
        }
      Tensor got2 = run();  // bitwise repeatable
      EXPECT_EQ(std::memcmp(got.raw(), got2.raw(), got.nbytes()), 0) << "not bitwise repeatable";
      note_compared_graph(g);
    }
}

MT_CUDA_CASE_TEST(CudaGradGemm, GroupedWgradAccumulateBf16IntoFloat32,
                  "grouped_matmul_wgrad_accumulate") {
  Backend& be = cuda_backend();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // 5 experts over 1500 rows: expert 2 gets none, rows 700..799 and the tail are unused.
  const int64_t e = 5, rows = 1500, p = 129, q = 200;
  const std::vector<int32_t> groups = {0, 300, 800, 800, 1100, 300, 400, 0, 300, 333};
  auto expert_of = [&](int64_t r) {
    for (int64_t x = 0; x < e; ++x)
      if (r >= groups[size_t(x)] && r < groups[size_t(x)] + groups[size_t(e + x)]) return x;
    return int64_t(-1);
  };
  Tensor a = random_bf16(Shape{rows, p}, rng), b = random_bf16(Shape{rows, q}, rng);
  for (int64_t r = 0; r < rows; ++r)
    if (expert_of(r) < 0) {
      for (int64_t i = 0; i < p; ++i) a.data<BFloat16>()[r * p + i] = BFloat16(NAN);
      for (int64_t j = 0; j < q; ++j) b.data<BFloat16>()[r * q + j] = BFloat16(NAN);
    }
  Tensor gt = Tensor::from_vector(groups, Shape{2, e});
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(fmt::format("overwrite {} (seed {})", overwrite, seed));
    Tensor dst0 = Tensor::empty(Shape{e, p, q}, DType::kF32);
    std::uniform_real_distribution<double> u(-4, 4);
    for (int64_t i = 0; i < dst0.numel(); ++i) dst0.data<float>()[i] = float(u(rng));
    Graph g;
    Builder bld(g, NodePhase::kBackward);
    ValueId d = bld.persistent("dst", {Shape{e, p, q}, DType::kF32}, ValueRole::kGradient);
    ValueId va = bld.input("a", {a.shape(), DType::kBF16}),
            vb = bld.input("b", {b.shape(), DType::kBF16});
    ValueId vg = bld.input("groups", {gt.shape(), DType::kI32});
    ops::grouped_matmul_wgrad_accumulate(bld, d, va, vb, vg, overwrite);
    const auto run = [&] { return run_twice(be, g, d, dst0, {{va, &a}, {vb, &b}, {vg, &gt}}); };
    Tensor got = run();
    const double u32 = std::ldexp(1.0, -24);
    int bad = 0;
    for (int64_t x = 0; x < e && bad < 5; ++x)
      for (int64_t i = 0; i < p && bad < 5; ++i)
        for (int64_t j = 0; j < q && bad < 5; ++j) {
          double prod = 0, terms = 0;
          const int64_t start = groups[size_t(x)], count = groups[size_t(e + x)];
          for (int64_t r = start; r < start + count; ++r) {
            const double t = double(float(a.data<BFloat16>()[r * p + i])) *
                             double(float(b.data<BFloat16>()[r * q + j]));
            prod += t;
            terms += std::abs(t);
          }
          const int64_t at = (x * p + i) * q + j;
          const double old = dst0.data<float>()[at];
          const double want = overwrite ? prod : old + 2 * prod;
          const double tol =
              2 * u32 * double(count) * terms + 4 * u32 * (std::abs(old) + 2 * terms);
          const double v = got.data<float>()[at];
          if (!(std::abs(v - want) <= tol) || (count == 0 && v != want)) {
            ++bad;
            ADD_FAILURE() << "expert " << x << " element " << i << "," << j << ": got " << v
                          << ", want " << want << " (tolerance " << tol << ")";
          }
        }
    Tensor got2 = run();
    EXPECT_EQ(std::memcmp(got.raw(), got2.raw(), got.nbytes()), 0) << "not bitwise repeatable";
    note_compared_graph(g);
  }
}

}  // namespace
}  // namespace meshtrain::cudatest
