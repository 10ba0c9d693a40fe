// meshtrain's Hopper grouped GEMM (moe/cuda/grouped_gemm_sm90.cu), every tile variant, against a
// float64 CPU reference on fresh random bf16 data: 16 experts with 0, 1, 127..129, 255..257, 640
// and more rows, gaps of NaN rows between the groups and after them (a kernel that reads a row of
// another group into a product shows NaN), extents that are not multiples of any tile, and enough
// tiles that every CTA of the persistent grid walks several. The forward and the data gradient must
// leave the rows outside every group untouched (they stay 0xFF-poisoned); the weight gradient
// zeroes experts with no rows (=) or leaves them (+=). The default variant repeats bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/moe/cuda/grouped_gemm_sm90.h"
#include "meshtrain/runtime/cuda/cuda_check.h"
#include "op_harness.h"

namespace meshtrain {
namespace {

constexpr int64_t kP = 264, kQ = 1032;  // x, a: [rows, P]; dy, b: [rows, Q]; w [E, Q, P]

struct Problem {
  int64_t experts = 0, rows = 0;
  std::vector<int32_t> groups;  // [2, E]
  std::vector<uint16_t> x, dy, w;
  int expert_of(int64_t r) const {
    for (int64_t e = 0; e < experts; ++e)
      if (r >= groups[size_t(e)] && r < groups[size_t(e)] + groups[size_t(experts + e)])
        return int(e);
    return -1;
  }
};

double val(uint16_t b) { return double(BFloat16::to_float(b)); }

Problem make_problem(std::mt19937_64& rng) {
  Problem pr;
  const std::vector<int32_t> counts = {0,  1,   127, 128, 129, 300, 401, 64,
                                       65, 640, 0,   33,  255, 256, 257, 600};
  pr.experts = int64_t(counts.size());
  pr.groups.assign(size_t(2 * pr.experts), 0);
  int32_t at = 0;
  for (int64_t e = 0; e < pr.experts; ++e) {
    pr.groups[size_t(e)] = at;
    pr.groups[size_t(pr.experts + e)] = counts[size_t(e)];
    at += counts[size_t(e)] + 8 - (counts[size_t(e)] % 8 == 0 ? 8 : counts[size_t(e)] % 8) + 8;
  }
  pr.rows = at + 50;
  std::uniform_real_distribution<double> u(-1, 1);
  auto fill = [&](std::vector<uint16_t>& v, int64_t rows, int64_t cols, bool by_group) {
    v.resize(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[size_t(r * cols + c)] = by_group && pr.expert_of(r) < 0
                                      ? BFloat16::from_float(NAN)
                                      : BFloat16::from_float(float(u(rng)));
  };
  fill(pr.x, pr.rows, kP, true);
  fill(pr.dy, pr.rows, kQ, true);
  fill(pr.w, pr.experts * kQ, kP, false);
  return pr;
}

struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Device() { cudaFree(p); }
  template <typename T>
  void upload(const std::vector<T>& v) {
    CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// |got - want| <= 2^-8 |want| (the bf16 output's rounding, twice) + 2^-14 Σ|terms| (fp32 sums).
bool close(double got, double want, double terms, bool bf16_out) {
  const double tol = (bf16_out ? std::ldexp(1.0, -8) * std::abs(want) : 0.0) +
                     std::ldexp(1.0, -14) * terms + 1e-30;
  return std::abs(got - want) <= tol;
}

// y[rows of e] = x · w_eᵀ (forward) or dy · w_e (dgrad); checks every row of y.
void check_rows_gemm(const Problem& pr, bool forward, int variant) {
  const int64_t k = forward ? kP : kQ, n = forward ? kQ : kP;
  const std::vector<uint16_t>& in = forward ? pr.x : pr.dy;
  Device dx(in.size() * 2), dw(pr.w.size() * 2), dy(size_t(pr.rows * n) * 2),
      dg(pr.groups.size() * 4);
  dx.upload(in);
  dw.upload(pr.w);
  dg.upload(pr.groups);
  CUDA_CHECK(cudaMemset(dy.p, 0xFF, size_t(pr.rows * n) * 2));
  const cuda::GroupedGemmSm90 g{
      dx.p, dw.p, dy.p, static_cast<const int32_t*>(dg.p), pr.experts, pr.rows, n, k, forward};
  ASSERT_TRUE(cuda::grouped_gemm_sm90(g, nullptr, variant)) << "refused a supported shape";
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = dy.download<uint16_t>(size_t(pr.rows * n));
  int bad = 0;
  for (int64_t r = 0; r < pr.rows && bad < 8; ++r) {
    const int e = pr.expert_of(r);
    for (int64_t c = 0; c < n && bad < 8; ++c) {
      const uint16_t gb = got[size_t(r * n + c)];
      if (e < 0) {
        if (gb != 0xFFFF && ++bad)
          ADD_FAILURE() << "row " << r << " (no group) col " << c << " was written: " << val(gb);
        continue;
      }
      double want = 0, terms = 0;
      for (int64_t i = 0; i < k; ++i) {
        // forward: w_e [Q = n, P = k] transposed; dgrad: w_e [Q = k, P = n]
        const double wv = forward ? val(pr.w[size_t((e * kQ + c) * kP + i)])
                                  : val(pr.w[size_t((e * kQ + i) * kP + c)]);
        const double t = val(in[size_t(r * k + i)]) * wv;
        want += t;
        terms += std::abs(t);
      }
      if (!close(val(gb), want, terms, true) && ++bad)
        ADD_FAILURE() << "row " << r << " (expert " << e << ") col " << c << ": got " << val(gb)
                      << " want " << want;
    }
  }
}

void check_wgrad(const Problem& pr, bool out_f32, bool accumulate, int variant,
                 std::mt19937_64& rng) {
  const int64_t E = pr.experts, n_out = E * kP * kQ;
  Device da(pr.x.size() * 2), db(pr.dy.size() * 2), dout(size_t(n_out) * (out_f32 ? 4 : 2)),
      dg(pr.groups.size() * 4);
  da.upload(pr.x);
  db.upload(pr.dy);
  dg.upload(pr.groups);
  std::vector<float> old(size_t(accumulate ? n_out : 0));
  std::uniform_real_distribution<double> u(-4, 4);
  for (auto& v : old) v = float(u(rng));
  if (accumulate)
    dout.upload(old);
  else
    CUDA_CHECK(cudaMemset(dout.p, 0xFF, size_t(n_out) * (out_f32 ? 4 : 2)));
  const cuda::GroupedWgradSm90 g{da.p,    db.p,      dout.p, static_cast<const int32_t*>(dg.p),
                                 E,       pr.rows,   kP,     kQ,
                                 out_f32, accumulate};
  ASSERT_TRUE(cuda::grouped_wgrad_sm90(g, nullptr, variant)) << "refused a supported shape";
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got32;
  std::vector<uint16_t> got16;
  if (out_f32)
    got32 = dout.download<float>(size_t(n_out));
  else
    got16 = dout.download<uint16_t>(size_t(n_out));
  int bad = 0;
  for (int64_t e = 0; e < E && bad < 8; ++e) {
    const int64_t start = pr.groups[size_t(e)], count = pr.groups[size_t(E + e)];
    for (int64_t i = 0; i < kP && bad < 8; ++i)
      for (int64_t j = 0; j < kQ && bad < 8; ++j) {
        double prod = 0, terms = 0;
        for (int64_t r = start; r < start + count; ++r) {
          const double t = val(pr.x[size_t(r * kP + i)]) * val(pr.dy[size_t(r * kQ + j)]);
          prod += t;
          terms += std::abs(t);
        }
        const size_t at = size_t((e * kP + i) * kQ + j);
        const double base = accumulate ? double(old[at]) : 0.0;
        const double want = base + prod;
        const double v = out_f32 ? double(got32[at]) : val(got16[at]);
        const bool exact = count == 0;  // zeros, or the old value untouched
        if ((exact ? v != want : !close(v, want, terms + std::abs(base), !out_f32)) && ++bad)
          ADD_FAILURE() << "expert " << e << " (" << count << " rows) element " << i << "," << j
                        << ": got " << v << " want " << want;
      }
  }
}

TEST(CudaGroupedGemmSm90, EveryVariantMatchesFloat64Reference) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  const uint64_t seed = cudatest::fresh_seed();
  std::mt19937_64 rng(seed);
  const Problem pr = make_problem(rng);
  ASSERT_TRUE(cuda::grouped_gemm_sm90_supports(pr.experts, kQ, kP))
      << "this GPU is not compute capability 9.0 (the kernel needs Hopper)";
  for (int v = 0; v < cuda::grouped_gemm_sm90_num_variants(); ++v) {
    SCOPED_TRACE(
        fmt::format("variant {} ({}), seed {}", v, cuda::grouped_gemm_sm90_variant_name(v), seed));
    {
      SCOPED_TRACE("forward y = x w_eᵀ");
      check_rows_gemm(pr, true, v);
    }
    {
      SCOPED_TRACE("dgrad y = dy w_e");
      check_rows_gemm(pr, false, v);
    }
    for (auto [f32, acc] :
         {std::pair{true, false}, std::pair{true, true}, std::pair{false, false}}) {
      SCOPED_TRACE(fmt::format("wgrad out {} {}", f32 ? "float32" : "bfloat16", acc ? "+=" : "="));
      check_wgrad(pr, f32, acc, v, rng);
    }
  }
}

// The variants the ops take (the default, and pingpong for the short-K weight gradient) repeat.
TEST(CudaGroupedGemmSm90, DefaultRepeatsBitwiseAndRefusesWhatItCannotRun) {
  cudatest::cuda_backend();
  std::mt19937_64 rng(cudatest::fresh_seed());
  const Problem pr = make_problem(rng);
  Device dx(pr.x.size() * 2), dw(pr.w.size() * 2), dy(size_t(pr.rows * kQ) * 2),
      dg(pr.groups.size() * 4), dout(size_t(pr.experts * kP * kQ) * 4);
  dx.upload(pr.x);
  dw.upload(pr.w);
  dg.upload(pr.groups);
  const auto* groups = static_cast<const int32_t*>(dg.p);
  std::vector<uint16_t> y0;
  std::vector<float> w0[2];
  const int wgrad_variants[2] = {cuda::kGroupedSm90Wide, cuda::kGroupedSm90Pingpong};
  for (int run = 0; run < 3; ++run) {
    CUDA_CHECK(cudaMemset(dy.p, 0xFF, size_t(pr.rows * kQ) * 2));
    ASSERT_TRUE(cuda::grouped_gemm_sm90(
        {dx.p, dw.p, dy.p, groups, pr.experts, pr.rows, kQ, kP, true}, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto y = dy.download<uint16_t>(size_t(pr.rows * kQ));
    if (run == 0) y0 = y;
    EXPECT_EQ(std::memcmp(y.data(), y0.data(), y.size() * 2), 0) << "forward not repeatable";
    for (int i = 0; i < 2; ++i) {
      CUDA_CHECK(cudaMemset(dout.p, 0xFF, size_t(pr.experts * kP * kQ) * 4));
      ASSERT_TRUE(cuda::grouped_wgrad_sm90(
          {dx.p, dy.p, dout.p, groups, pr.experts, pr.rows, kP, kQ, true, false}, nullptr,
          wgrad_variants[i]));
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto w = dout.download<float>(size_t(pr.experts * kP * kQ));
      if (run == 0) w0[i] = w;
      EXPECT_EQ(std::memcmp(w.data(), w0[i].data(), w.size() * 4), 0)
          << "wgrad not repeatable: " << cuda::grouped_gemm_sm90_variant_name(wgrad_variants[i]);
    }
  }
  // Extents whose rows are not 16-byte multiples, too many experts, a bf16 +=, bad variants.
  EXPECT_FALSE(cuda::grouped_gemm_sm90_supports(pr.experts, kQ + 4, kP));
  EXPECT_FALSE(cuda::grouped_gemm_sm90_supports(cuda::kGroupedSm90MaxExperts + 1, kQ, kP));
  EXPECT_FALSE(cuda::grouped_gemm_sm90(
      {dx.p, dw.p, dy.p, groups, pr.experts, pr.rows, kQ, kP - 4, true}, nullptr));
  EXPECT_FALSE(cuda::grouped_wgrad_sm90(
      {dx.p, dy.p, dout.p, groups, pr.experts, pr.rows, kP, kQ, false, true}, nullptr));
  EXPECT_FALSE(
      cuda::grouped_gemm_sm90({dx.p, dw.p, dy.p, groups, pr.experts, pr.rows, kQ, kP, true},
                              nullptr, cuda::grouped_gemm_sm90_num_variants()));
}

}  // namespace
}  // namespace meshtrain
