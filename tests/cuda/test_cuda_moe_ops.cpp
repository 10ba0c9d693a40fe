// CPU-vs-CUDA checks of the MoE ops (see op_harness.h): the router (softmax and sigmoid, expert
// bias, group-limited routing, route_norm and route_scale, ties), the dispatch plan, permutation,
// grouped GEMMs and combine chained as a MoE layer uses them (forward and every gradient:
// moe_row_dot, grouped_matmul with the weight untransposed, grouped_matmul_wgrad), token counts,
// and the expert-bias update. Integer outputs (expert ids, row maps, groups, counts) must be
// equal; padding rows of the permuted buffers are compared too (zeros on both sides).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/moe/combine.h"
#include "meshtrain/moe/cuda/load_balance_kernels.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/moe/load_balance.h"
#include "meshtrain/moe/router.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/runtime/cuda/cuda_check.h"
#include "op_harness.h"

namespace meshtrain::cudatest {
namespace {

using V = std::vector<ValueId>;

struct RouterCase {
  std::string score = "softmax";
  int64_t tokens = 37, experts = 8, k = 3, groups = 0, limited = 0;
  bool norm = false;
  double scale = 1.0;
  bool ties = false;  // every logit equal: the lowest ids must win
};

OpCase router_case(const RouterCase& r, DType dt) {
  ops::RouterConfig cfg;
  cfg.score_func = r.score;
  cfg.top_k = r.k;
  cfg.num_expert_groups = r.groups;
  cfg.num_limited_groups = r.limited;
  cfg.route_norm = r.norm;
  cfg.route_scale = r.scale;
  InputSpec logits{Shape{r.tokens, r.experts}, dt, true, -3.0, 3.0};
  if (r.ties) logits.gen = [](std::mt19937_64&, int64_t) { return 0.25; };
  InputSpec bias{Shape{r.experts}, dt, false, -0.05, 0.05};
  if (r.ties) bias.gen = [](std::mt19937_64&, int64_t) { return 0.0; };
  return {.name = fmt::format("router/{}/{}/T={}/E={}/k={}/groups={}:{}/norm={}/scale={}{}",
                              dtype_name(dt), r.score, r.tokens, r.experts, r.k, r.groups,
                              r.limited, r.norm, r.scale, r.ties ? "/ties" : ""),
          .inputs = {logits, bias},
          .build = [cfg](Builder& b, const V& x) {
            ops::RouterOutputs o = ops::router(b, x[0], x[1], cfg);
            return V{o.ids, o.weights};
          }};
}

MT_CUDA_CASE_TEST(CudaMoeOps, Router, "router", "router_backward") {
  std::vector<RouterCase> cases = {
      {},
      {.score = "sigmoid", .tokens = 64, .experts = 8, .k = 1},
      {.tokens = 1, .experts = 8, .k = 8},
      {.tokens = 300, .experts = 64, .k = 6, .norm = true, .scale = 2.5},
      {.score = "sigmoid",
       .tokens = 129,
       .experts = 64,
       .k = 6,
       .groups = 8,
       .limited = 3,
       .norm = true,
       .scale = 2.5},
      {.tokens = 50, .experts = 256, .k = 8, .groups = 8, .limited = 4},
      {.tokens = 33, .experts = 20, .k = 5, .groups = 4, .limited = 2},
      {.tokens = 40, .experts = 64, .k = 6, .ties = true},
      {.score = "sigmoid",
       .tokens = 40,
       .experts = 16,
       .k = 4,
       .groups = 4,
       .limited = 2,
       .ties = true},
  };
  for (const RouterCase& r : cases)
    for (DType dt : {DType::kF32, DType::kF64}) expect_case(router_case(r, dt));
}

struct MoeChainCase {
  int64_t tokens = 45, k = 3, experts = 8, d = 64, hidden = 48, align = 1;
  bool score_before = false;
  bool one_expert = false;  // every choice goes to expert 2 (the other experts get no rows)
};

// ids -> plan -> permute (weighted when score_before) -> grouped_matmul w1ᵀ -> grouped_matmul w2
// untransposed ([E, hidden, D]) -> combine (weighted unless score_before). Outputs: the row map,
// the groups, the permuted buffer and the layer output; gradients for x, w1, w2 and the weights.
OpCase moe_chain_case(const MoeChainCase& m, DType dt) {
  InputSpec ids{Shape{m.tokens, m.k}, DType::kI32};
  ids.int_lo = 0, ids.int_hi = m.experts;
  if (m.one_expert) ids.gen = [](std::mt19937_64&, int64_t) { return 2.0; };
  // bf16 rows take float32 weights on the device; the CPU side (float32 rows, float64 weights)
  // casts the weights to the rows' dtype.
  const DType wdt = dt == DType::kBF16 ? DType::kF32 : dt;
  return {.name = fmt::format("moe_chain/{}/T={}/k={}/E={}/D={}/H={}/align={}/{}{}", dtype_name(dt),
                              m.tokens, m.k, m.experts, m.d, m.hidden, m.align,
                              m.score_before ? "score_before" : "score_after",
                              m.one_expert ? "/one_expert" : ""),
          .inputs = {ids,
                     {Shape{m.tokens, m.d}, dt},
                     {Shape{m.experts, m.hidden, m.d}, dt, true, -0.2, 0.2},
                     {Shape{m.experts, m.hidden, m.d}, dt, true, -0.2, 0.2},
                     {Shape{m.tokens, m.k}, wdt, true, 0.1, 1.0}},
          .build =
              [m](Builder& b, const V& x) {
                ValueId w = x[4];
                if (b.dtype(x[1]) != DType::kBF16 && b.dtype(w) != b.dtype(x[1]))
                  w = ops::cast(b, w, b.dtype(x[1]));
                ops::DispatchPlan plan = ops::moe_dispatch_plan(b, x[0], m.experts, m.align);
                ValueId xp = ops::moe_permute(b, x[1], plan, m.score_before ? w : kNoValue);
                ValueId h = ops::grouped_matmul(b, xp, x[2], plan.groups, true);
                ValueId y = ops::grouped_matmul(b, h, x[3], plan.groups, false);
                ValueId out = ops::moe_combine(b, y, plan.row_map, m.score_before ? kNoValue : w);
                return V{plan.row_map, plan.groups, xp, out};
              },
          // Every output and gradient is a sum of products of the inputs, and many cancel (the
          // score gradient of one token with one expert sums D products of ~equal size), so the
          // bound is Σ|terms| (op_harness.h). bf16: the GPU rounds the permuted rows (weighted
          // when score_before), h, y and the combine's output, and in backward each stored
          // gradient, to bf16 (up to ~6 roundings on a path, fp32 accumulation far below them);
          // the CPU reference keeps float32 throughout. The scores and their gradient stay
          // float32 in the bf16 run, but that gradient sums products of the bf16-rounded y and
          // dout, so its bound takes bf16's u (terms_dtype); with fp32's u the bound sat below
          // the chain's own roundings and failed on every seed of the H200 run. The float32 case
          // checks the same kernels' logic at accumulation-order precision.
          // float32 / float64: accumulation order only.
          .tol = dt == DType::kBF16
                     ? Tolerance{.rtol = 2e-2, .terms = 8, .terms_dtype = DType::kBF16}
                     : Tolerance{.terms = 64}};
}

MT_CUDA_CASE_TEST(CudaMoeOps, DispatchPermuteGroupedGemmCombine, "moe_dispatch_plan", "moe_permute",
                  "grouped_matmul", "grouped_matmul_wgrad", "moe_combine", "moe_row_dot") {
  std::vector<MoeChainCase> cases = {
      {},
      {.align = 16},
      {.align = 8, .score_before = true},
      {.tokens = 300, .k = 6, .experts = 64, .d = 128, .hidden = 96, .align = 16},
      {.tokens = 20, .k = 2, .experts = 16, .align = 4, .one_expert = true},
      {.tokens = 1, .k = 1, .experts = 4, .d = 24, .hidden = 8},
      {.tokens = 2100, .k = 2, .experts = 5, .d = 16, .hidden = 8, .align = 3},  // 5 plan chunks
      {.tokens = 33, .k = 3, .experts = 8, .d = 37, .hidden = 13},  // odd D: scalar accesses
  };
  for (const MoeChainCase& m : cases)
    for (DType dt : {DType::kF32, DType::kBF16}) expect_case(moe_chain_case(m, dt));
  expect_case(moe_chain_case({.align = 16, .score_before = true}, DType::kF64));
}

TEST(CudaMoeOps, DispatchPlanIsStableAndReproducible) {
  // Many choices per expert across several 1024-choice chunks: token order must survive.
  InputSpec ids{Shape{3000, 6}, DType::kI32};
  ids.int_lo = 0, ids.int_hi = 7;
  OpCase c{.name = "moe_dispatch_plan/3000x6/E=7/align=16",
           .inputs = {ids},
           .build =
               [](Builder& b, const V& x) {
                 ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[0], 7, 16);
                 return V{p.row_map, p.groups};
               },
           .backward = false};
  expect_case(c);
}

MT_CUDA_CASE_TEST(CudaMoeOps, TokenCounts, "moe_token_counts") {
  for (DType dt : {DType::kF32, DType::kF64})
    for (int64_t e : {8, 64, 300}) {
      InputSpec ids{Shape{777, 6}, DType::kI32};
      ids.int_lo = 0, ids.int_hi = e;
      expect_case({.name = fmt::format("moe_token_counts/{}/E={}", dtype_name(dt), e),
                   .inputs = {ids},
                   .build = [=](Builder& b,
                                const V& x) { return V{ops::moe_token_counts(b, x[0], e, dt)}; },
                   .backward = false,
                   .same_dtypes_on_cpu = true,
                   .tol = {0, 0}});
    }
}

// The in-place bias update against the CPU kernel's formula (float64 mean in index order,
// sign with sign(0) = 0, re-centred deltas), with the counter as the counts (the 1-rank case)
// and with separate counts (the summed-over-ranks case); coeff 0 leaves the bias alone.
TEST(CudaMoeOps, ExpertBiasUpdate) {
  cuda_backend();  // selects the device, or fails the test clearly
  const int64_t e = 64;
  for (double coeff : {1e-3, 0.0})
    for (bool separate : {false, true}) {
      std::mt19937_64 rng(fresh_seed());
      std::vector<float> bias(e), counter(e), load(e, -1.0f), counts(e);
      for (int64_t i = 0; i < e; ++i) {
        bias[size_t(i)] = float(std::uniform_real_distribution<>(-0.01, 0.01)(rng));
        counter[size_t(i)] = float(rng() % 40);
        counts[size_t(i)] = float(rng() % 40);
      }
      counter[3] = counts[3] = 20.0f;  // some counts equal to the mean's neighbourhood
      const std::vector<float>& used = separate ? counts : counter;
      double mean = 0, dmean = 0;
      for (float c : used) mean += c;
      mean /= double(e);
      auto sgn = [](double x) { return double((x > 0) - (x < 0)); };
      for (float c : used) dmean += coeff * sgn(mean - c);
      dmean /= double(e);
      std::vector<float> want(e);
      for (int64_t i = 0; i < e; ++i)
        want[size_t(i)] =
            coeff > 0 ? float(double(bias[size_t(i)]) + coeff * sgn(mean - used[size_t(i)]) - dmean)
                      : bias[size_t(i)];
      float* dev = nullptr;
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), size_t(4 * e) * sizeof(float)));
      CUDA_CHECK(cudaMemcpy(dev, bias.data(), size_t(e) * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dev + e, counter.data(), size_t(e) * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dev + 2 * e, load.data(), size_t(e) * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(dev + 3 * e, counts.data(), size_t(e) * 4, cudaMemcpyHostToDevice));
      cuda::expert_bias_update(DType::kF32, dev, dev + e, dev + 2 * e,
                               separate ? static_cast<const void*>(dev + 3 * e) : dev + e, e, coeff,
                               nullptr);
      std::vector<float> got(size_t(3 * e));
      CUDA_CHECK(cudaMemcpy(got.data(), dev, got.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaFree(dev));
      for (int64_t i = 0; i < e; ++i) {
        EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "bias " << i << " coeff " << coeff;
        EXPECT_EQ(got[size_t(e + i)], 0.0f) << "counter " << i << " must be cleared";
        EXPECT_EQ(got[size_t(2 * e + i)], used[size_t(i)]) << "last_load " << i;
      }
    }
}

}  // namespace
}  // namespace meshtrain::cudatest
