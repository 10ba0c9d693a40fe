// deepseek_v3 training with auxiliary-loss-free load balancing: a small model trained on the
// default corpus through the real step graph (cpu_step.h), param store and optimizer graph (the
// bias update runs there), once with load balancing on and once off from the same seed; the expert
// imbalance (max / mean tokens per expert) over steps 100-200 must be lower with it on. Also the
// metrics the trainer derives from the per-layer loads.
#include <gtest/gtest.h>

#include "cpu_step.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

struct RunTrace {
  std::vector<double> loss;       // per step
  std::vector<double> imbalance;  // per step: mean over MoE layers of max / mean load
  std::vector<double> bias_abs;   // per step: max |expert_bias| over layers
};

// dim 64, 1 dense + 2 MoE layers of 8 experts top-2 (softmax) + 1 shared; 256 tokens a step.
RunTrace train_small(double coeff, int steps) {
  DeepSeekV3Args a;
  a.dim = 64;
  a.inter_dim = 128;
  a.moe_inter_dim = 32;
  a.n_layers = 3;
  a.n_dense_layers = 1;
  a.n_heads = 4;
  a.q_lora_rank = 0;
  a.kv_lora_rank = 32;
  a.qk_nope_head_dim = 16;
  a.qk_rope_head_dim = 8;
  a.v_head_dim = 16;
  a.moe.num_experts = 8;
  a.moe.num_shared_experts = 1;
  a.moe.top_k = 2;
  a.moe.score_func = "softmax";
  a.moe.score_before_experts = false;
  a.moe.load_balance_coeff = coeff;
  const int64_t B = 8, S = 32;
  const uint64_t seed = 3;

  auto tokenizer = make_tokenizer("byte");
  TokenLoader loader(open_data_source("fortunes", ""), *tokenizer, S, B, 0, 1, 1, seed);
  a.vocab_size = std::max<int64_t>(tokenizer->vocab_size(), loader.max_token_id() + 1);

  JobConfig cfg;
  cfg.training.local_batch_size = B;
  cfg.training.seq_len = S;
  testing::CpuStep cs =
      testing::cpu_step(cfg, {.make_model = [&] { return create_deepseek_v3(a, "small"); }}, seed);
  cs.prepare();
  const ParallelPlan& plan = cs.plan();
  ParamStore& store = *cs.store;
  Optimizer opt(store, ops::AdamWParams{}, *cs.backend, nullptr,
                {.layers = plan.load_balance_layers()});

  RunTrace trace;
  for (int step = 1; step <= steps; ++step) {
    loader.next(cs.tokens().data<int32_t>(), cs.labels().data<int32_t>());
    cs.ex->run();
    trace.loss.push_back(cs.loss());
    opt.step(step, 3e-3);
    double imb = 0, bias = 0;
    for (const LoadBalanceLayer& l : plan.load_balance_layers()) {
      std::vector<float> t = store.master(l.last_load).to_vector<float>();
      imb +=
          summarize_moe_load(l.layer, l.block, std::vector<double>(t.begin(), t.end())).imbalance;
      for (float v : store.master(l.expert_bias).to_vector<float>())
        bias = std::max(bias, double(std::abs(v)));
    }
    trace.imbalance.push_back(imb / double(plan.load_balance_layers().size()));
    trace.bias_abs.push_back(bias);
  }
  return trace;
}

double mean_over(const std::vector<double>& v, int first_step, int last_step) {
  double s = 0;
  for (int i = first_step; i <= last_step; ++i) s += v[size_t(i - 1)];
  return s / double(last_step - first_step + 1);
}

TEST(DeepSeekV3Training, LoadBalancingLowersExpertImbalance) {
  RunTrace on = train_small(1e-3, 200);
  RunTrace off = train_small(0.0, 200);
  // Same seed, same data: the first step is identical (the bias is still zero when it runs).
  EXPECT_EQ(on.loss[0], off.loss[0]);
  EXPECT_EQ(off.bias_abs.back(), 0.0);
  EXPECT_GT(on.bias_abs.back(), 0.0);
  const double imb_on = mean_over(on.imbalance, 100, 200);
  const double imb_off = mean_over(off.imbalance, 100, 200);
  EXPECT_LT(imb_on, imb_off) << "mean max/mean expert load over steps 100-200";
  // Both runs learn.
  EXPECT_LT(mean_over(on.loss, 190, 200), 0.8 * on.loss[0]);
  EXPECT_LT(mean_over(off.loss, 190, 200), 0.8 * off.loss[0]);
  std::printf(
      "imbalance over steps 100-200: on %.3f, off %.3f; loss step 1 %.3f -> 200 on %.3f, "
      "off %.3f\n",
      imb_on, imb_off, on.loss[0], on.loss.back(), off.loss.back());
}

TEST(DeepSeekV3Training, MoeLoadMetricsAndSummary) {
  std::vector<MoeLayerLoad> loads = {summarize_moe_load("layers.1.moe", 1, {4, 4, 4, 4}),
                                     summarize_moe_load("layers.2.moe", 2, {10, 2, 2, 2})};
  EXPECT_DOUBLE_EQ(loads[0].imbalance, 1.0);
  EXPECT_DOUBLE_EQ(loads[1].min, 2);
  EXPECT_DOUBLE_EQ(loads[1].max, 10);
  EXPECT_DOUBLE_EQ(loads[1].mean, 4);
  EXPECT_DOUBLE_EQ(loads[1].imbalance, 2.5);
  StepMetrics m;
  add_moe_load_metrics(loads, m);
  EXPECT_DOUBLE_EQ(m.extra.at("moe.layers.2.load_max"), 10);
  EXPECT_DOUBLE_EQ(m.extra.at("moe.layers.2.imbalance"), 2.5);
  EXPECT_DOUBLE_EQ(m.extra.at("moe.layers.1.load_min"), 4);
  EXPECT_DOUBLE_EQ(m.extra.at("moe.imbalance_avg"), 1.75);
  EXPECT_DOUBLE_EQ(m.extra.at("moe.imbalance_max"), 2.5);
  EXPECT_EQ(m.summary_suffix, "moe load max/mean: avg 1.75, worst 2.50 (layers.2)");
  StepMetrics dense;
  add_moe_load_metrics({}, dense);
  EXPECT_TRUE(dense.extra.empty());
  EXPECT_TRUE(dense.summary_suffix.empty());
}

}  // namespace
}  // namespace meshtrain
