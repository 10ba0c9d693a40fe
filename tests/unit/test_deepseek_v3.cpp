// deepseek_v3: flavor shapes and torchtitan's parameter names, the 16B / 236B / 671B counts
// `meshtrain plan` reports, the softmax scale rule, float64 gradchecks of MLA (both q paths, with
// YaRN and mscale active), YaRN rope, the MoE block, and of the whole tiny model's loss with
// respect to every parameter through the real plan / autodiff / executor / param store path.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "cpu_step.h"
#include "gradcheck.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/model/counting.h"
#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {
namespace {
using testing::expect_grad_ok;
using testing::gradcheck;
using testing::InputSpec;

// dim 32, 1 dense + 1 MoE layer, 4 experts top-2 + 1 shared; YaRN and mscale active from
// seq_len 5 on (original_seq_len 4); groups padded to 4 rows.
DeepSeekV3Args tiny_args(int64_t q_lora_rank) {
  DeepSeekV3Args a;
  a.vocab_size = 11;
  a.dim = 32;
  a.inter_dim = 48;
  a.moe_inter_dim = 16;
  a.n_layers = 2;
  a.n_dense_layers = 1;
  a.n_heads = 2;
  a.q_lora_rank = q_lora_rank;
  a.kv_lora_rank = 16;
  a.qk_nope_head_dim = 8;
  a.qk_rope_head_dim = 4;
  a.v_head_dim = 8;
  a.original_seq_len = 4;
  a.mscale = 0.7;
  a.moe.num_experts = 4;
  a.moe.num_shared_experts = 1;
  a.moe.top_k = 2;
  a.moe.score_func = "softmax";
  a.moe.score_before_experts = false;
  a.moe.token_group_alignment = 4;
  return a;
}

std::unique_ptr<StepGraph> build_flavor(const std::string& flavor, int64_t seq_len) {
  JobConfig cfg;
  cfg.model.name = "deepseek_v3";
  cfg.model.flavor = flavor;
  cfg.training.seq_len = seq_len;
  cfg.training.local_batch_size = 1;
  return build_step_graph(cfg, nullptr, {.tokenizer_vocab = 258});
}

TEST(DeepSeekV3, PlanCountsOf16BMatchTorchtitan) {
  auto sg = build_flavor("16B", 4096);
  ModelCounts c = count_model(*sg->model, *sg->plan, 4096);
  EXPECT_NEAR(double(c.total_params) / 15.71e9, 1.0, 0.005) << c.total_params;
  EXPECT_NEAR(c.active_params / 2.66e9, 1.0, 0.005) << c.active_params;
  EXPECT_NEAR(c.active_non_embedding / 2.45e9, 1.0, 0.005) << c.active_non_embedding;
  // torchtitan: 6 × active non-embedding + 6 · layers · heads · (nope + rope + v) · seq_len.
  EXPECT_DOUBLE_EQ(c.flops_per_token,
                   6 * c.active_non_embedding + 6.0 * 27 * 16 * (128 + 64 + 128) * 4096);
  // Routed experts count at top_k / num_experts = 6/64 of their 26 · 3 · 64 · 1408 · 2048.
  const double experts = 26.0 * 3 * 64 * 1408 * 2048;
  EXPECT_NEAR(double(c.total_params) - c.active_params, experts * (1 - 6.0 / 64), 1.0);
}

TEST(DeepSeekV3, PlanCountsOfTheLargeFlavors) {
  auto v2 = build_flavor("236B", 128);
  ModelCounts c = count_model(*v2->model, *v2->plan, 128);
  EXPECT_NEAR(double(c.total_params) / 235.74e9, 1.0, 0.005);
  EXPECT_NEAR(c.active_params / 21.38e9, 1.0, 0.005);
  auto v3 = build_flavor("671B", 128);
  c = count_model(*v3->model, *v3->plan, 128);
  EXPECT_NEAR(double(c.total_params) / 671.0e9, 1.0, 0.005);
  EXPECT_NEAR(c.active_params / 37.5e9, 1.0, 0.005);
}

TEST(DeepSeekV3, TorchtitanParameterNamesAndShapes) {
  auto sg = build_flavor("16B", 64);
  const ParallelPlan& p = *sg->plan;
  auto shape = [&](const std::string& n) { return p.info(n).global_shape; };
  EXPECT_EQ(shape("tok_embeddings.weight"), (Shape{102400, 2048}));
  EXPECT_EQ(shape("layers.0.attention.wq.weight"), (Shape{16 * 192, 2048}));
  EXPECT_EQ(shape("layers.0.attention.wkv_a.weight"), (Shape{512 + 64, 2048}));
  EXPECT_EQ(shape("layers.0.attention.kv_norm.weight"), (Shape{512}));
  EXPECT_EQ(shape("layers.0.attention.wkv_b.weight"), (Shape{16 * 256, 512}));
  EXPECT_EQ(shape("layers.0.attention.wo.weight"), (Shape{2048, 16 * 128}));
  EXPECT_EQ(shape("layers.0.feed_forward.w1.weight"), (Shape{10944, 2048}));
  EXPECT_EQ(shape("layers.1.moe.experts.w1"), (Shape{64, 1408, 2048}));
  EXPECT_EQ(shape("layers.1.moe.experts.w2"), (Shape{64, 2048, 1408}));
  EXPECT_EQ(shape("layers.1.moe.experts.w3"), (Shape{64, 1408, 2048}));
  EXPECT_EQ(p.info("layers.1.moe.experts.w1").kind, ParamKind::kExpert);
  EXPECT_EQ(shape("layers.1.moe.router.gate.weight"), (Shape{64, 2048}));
  EXPECT_EQ(shape("layers.1.moe.shared_experts.w1.weight"), (Shape{2 * 1408, 2048}));
  EXPECT_EQ(shape("layers.1.moe.shared_experts.w2.weight"), (Shape{2048, 2 * 1408}));
  EXPECT_EQ(shape("layers.1.moe.expert_bias"), (Shape{64}));
  EXPECT_FALSE(p.info("layers.1.moe.expert_bias").trainable);
  EXPECT_EQ(p.info("layers.1.moe.expert_bias").dtype, DType::kF32);
  EXPECT_EQ(p.load_balance_layers().size(), 26u);
  EXPECT_EQ(p.load_balance_layers()[0].layer, "layers.1.moe");
  EXPECT_DOUBLE_EQ(p.load_balance_layers()[0].coeff, 1e-3);
  // The q_lora path of the large flavors.
  auto v3 = build_flavor("671B", 16);
  EXPECT_EQ(v3->plan->info("layers.0.attention.wq_a.weight").global_shape, (Shape{1536, 7168}));
  EXPECT_EQ(v3->plan->info("layers.0.attention.q_norm.weight").global_shape, (Shape{1536}));
  EXPECT_EQ(v3->plan->info("layers.0.attention.wq_b.weight").global_shape,
            (Shape{128 * 192, 1536}));
  EXPECT_EQ(v3->plan->info("layers.3.moe.experts.w1").global_shape, (Shape{256, 2048, 7168}));
}

TEST(DeepSeekV3, SoftmaxScaleGetsYarnMscaleOnlyBeyondTheOriginalLength) {
  DeepSeekV3Args a = deepseek_v3_flavor("debugmodel");
  EXPECT_DOUBLE_EQ(a.softmax_scale(4096), 1 / std::sqrt(192.0));
  const double m = 0.1 * 0.7 * std::log(40.0) + 1;
  EXPECT_DOUBLE_EQ(a.softmax_scale(4097), m * m / std::sqrt(192.0));
}

TEST(DeepSeekV3, UnknownFlavorAndBadArgsNameTheProblem) {
  try {
    deepseek_v3_flavor("7B");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expected one of debugmodel, 16B, 236B, 671B"),
              std::string::npos);
  }
  DeepSeekV3Args a = tiny_args(0);
  a.moe.top_k = 5;
  try {
    create_deepseek_v3(a, "tiny");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("top_k must be in [1, num_experts = 4], found 5"),
              std::string::npos);
  }
}

TEST(DeepSeekV3, GradCheckMlaBothQueryPathsWithYarn) {
  const int64_t B = 2, S = 6;
  for (int64_t q_lora : {0, 12}) {
    SCOPED_TRACE(fmt::format("q_lora_rank {}", q_lora));
    DeepSeekV3Args a = tiny_args(q_lora);
    ASSERT_TRUE(ops::yarn_applies(a.rope_config(), S));
    const int64_t D = a.dim, H = a.n_heads, qk = a.qk_head_dim();
    std::vector<InputSpec> in = {{Shape{B, S, D}}};
    if (q_lora == 0) {
      in.push_back({Shape{H * qk, D}, DType::kF64, true, 0, -0.3, 0.3});
    } else {
      in.push_back({Shape{q_lora, D}, DType::kF64, true, 0, -0.3, 0.3});
      in.push_back({Shape{q_lora}, DType::kF64, true, 0, 0.8, 1.2});
      in.push_back({Shape{H * qk, q_lora}, DType::kF64, true, 0, -0.3, 0.3});
    }
    in.push_back({Shape{a.kv_lora_rank + a.qk_rope_head_dim, D}, DType::kF64, true, 0, -0.3, 0.3});
    in.push_back({Shape{a.kv_lora_rank}, DType::kF64, true, 0, 0.8, 1.2});
    in.push_back({Shape{H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}, DType::kF64, true,
                  0, -0.3, 0.3});
    in.push_back({Shape{D, H * a.v_head_dim}, DType::kF64, true, 0, -0.3, 0.3});
    expect_grad_ok(gradcheck(in, [&](Builder& b, const std::vector<ValueId>& x) {
      MlaWeights w;
      size_t i = 1;
      if (q_lora == 0) {
        w.wq = x[i++];
      } else {
        w.wq_a = x[i++];
        w.q_norm = x[i++];
        w.wq_b = x[i++];
      }
      w.wkv_a = x[i++];
      w.kv_norm = x[i++];
      w.wkv_b = x[i++];
      w.wo = x[i++];
      ValueId table = ops::rope_table(b, S, a.qk_rope_head_dim, a.rope_config(), DType::kF64);
      return std::vector<ValueId>{mla_forward(b, a, w, x[0], table, S)};
    }));
  }
}

TEST(DeepSeekV3, GradCheckYarnRope) {
  DeepSeekV3Args a = tiny_args(0);
  const int64_t S = 7;
  expect_grad_ok(gradcheck(
      {{Shape{2, S, 3, a.qk_rope_head_dim}}}, [&](Builder& b, const std::vector<ValueId>& x) {
        ValueId t = ops::rope_table(b, S, a.qk_rope_head_dim, a.rope_config(), DType::kF64);
        return std::vector<ValueId>{ops::rope(b, x[0], t)};
      }));
}

// The MoE block on graph inputs. Fixed seed: routing must not flip under the finite-difference
// step, which a fresh draw could (rarely) put within 1e-6 of a tie.
TEST(DeepSeekV3, GradCheckMoeBlock) {
  for (bool before : {false, true}) {
    SCOPED_TRACE(before ? "score_before_experts" : "score after experts");
    DeepSeekV3Args a = tiny_args(0);
    a.moe.score_before_experts = before;
    a.moe.route_norm = before;
    const int64_t T = 10, D = a.dim, E = a.moe.num_experts, Hd = a.moe_inter_dim;
    InputSpec bias{.shape = Shape{E}, .differentiable = false, .values = {0.01, -0.02, 0, 0.015}};
    expect_grad_ok(gradcheck({{Shape{T, D}},
                              {Shape{E, D}},
                              bias,
                              {Shape{E, Hd, D}},
                              {Shape{E, D, Hd}},
                              {Shape{E, Hd, D}},
                              {Shape{Hd, D}},
                              {Shape{D, Hd}},
                              {Shape{Hd, D}}},
                             [&](Builder& b, const std::vector<ValueId>& x) {
                               MoeWeights w{.gate = x[1],
                                            .expert_bias = x[2],
                                            .w1 = x[3],
                                            .w2 = x[4],
                                            .w3 = x[5],
                                            .shared_w1 = x[6],
                                            .shared_w2 = x[7],
                                            .shared_w3 = x[8]};
                               return std::vector<ValueId>{moe_forward(b, a, w, x[0]).out};
                             },
                             {.seed = before ? 7u : 11u}));
  }
}

// The whole model: loss of a tiny DeepSeek-V3 in float64 built by the real step graph
// (cpu_step.h: persistent masters, gradient accumulators), run by the executor; every parameter's
// analytic gradient against central differences on its master values.
TEST(DeepSeekV3, GradCheckWholeModelLossAllParameters) {
  for (int64_t q_lora : {0, 12}) {
    SCOPED_TRACE(fmt::format("q_lora_rank {}", q_lora));
    const int64_t B = 2, S = 6;
    JobConfig cfg;
    cfg.training.local_batch_size = B;
    cfg.training.seq_len = S;
    testing::CpuStep cs = testing::cpu_step(
        cfg,
        {.compute_dtype = DType::kF64,
         .master_dtype = DType::kF64,
         .reduce_dtype = DType::kF64,
         .make_model = [&] { return create_deepseek_v3(tiny_args(q_lora), "tiny"); }},
        5);
    const ParallelPlan& plan = cs.plan();
    ParamStore& store = *cs.store;
    Executor& ex = *cs.ex;
    // Larger weights than the init (0.02) so every path carries a gradient well above noise;
    // a non-zero expert_bias so the biased choice is exercised.
    std::mt19937_64 rng(1234 + uint64_t(q_lora));
    for (const ParamInfo& p : plan.params()) {
      Tensor t = store.master(p.name);
      double* v = t.data<double>();
      const bool norm = p.global_shape.rank() == 1;
      const double a = norm ? 0.2 : 1.0 / std::sqrt(double(p.global_shape.last()));
      for (int64_t i = 0; i < t.numel(); ++i)
        v[i] =
            (norm && p.trainable ? 1.0 : 0.0) + std::uniform_real_distribution<double>(-a, a)(rng);
      if (!p.trainable && p.name.find("expert_bias") == std::string::npos)
        std::fill_n(v, t.numel(), 0.0);  // token counters
    }
    cs.prepare();
    int32_t* tok = cs.tokens().data<int32_t>();
    int32_t* lab = cs.labels().data<int32_t>();
    for (int64_t i = 0; i < B * S; ++i) {
      tok[i] = int32_t(std::uniform_int_distribution<int>(0, 10)(rng));
      lab[i] = int32_t(std::uniform_int_distribution<int>(0, 10)(rng));
    }
    ex.run();
    // Snapshot: every later run adds into the gradient accumulators again.
    std::map<std::string, std::vector<double>> analytic_of;
    for (const ParamInfo& p : plan.params())
      if (p.trainable) analytic_of[p.name] = store.grad(p.name).to_vector<double>();
    const double eps = 1e-6;
    int checked = 0;
    for (const ParamInfo& p : plan.params()) {
      if (!p.trainable) continue;
      Tensor m = store.master(p.name);
      const std::vector<double>& analytic = analytic_of[p.name];
      double* v = m.data<double>();
      double max_num = 0, max_diff = 0;
      const int64_t n = m.numel();
      for (int64_t s = 0; s < std::min<int64_t>(n, 8); ++s) {
        const int64_t i = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
        const double orig = v[i];
        v[i] = orig + eps;
        ex.run();
        const double lp = cs.loss();
        v[i] = orig - eps;
        ex.run();
        const double lm = cs.loss();
        v[i] = orig;
        const double num = (lp - lm) / (2 * eps);
        max_num = std::max(max_num, std::abs(num));
        max_diff = std::max(max_diff, std::abs(num - analytic[size_t(i)]));
        ++checked;
      }
      EXPECT_GT(max_num, 1e-7) << p.name << ": no gradient reaches it";
      EXPECT_LE(max_diff / std::max(max_num, 1e-9), 1e-6) << p.name;
    }
    EXPECT_GT(checked, 100);
  }
}

}  // namespace
}  // namespace meshtrain
