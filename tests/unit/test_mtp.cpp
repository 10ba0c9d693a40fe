// Multi-token prediction (model/mtp.h) on the model alone: the row shifts' values, the modules'
// parameter names and blocks, the masking and per-depth normalisation (a zero head gives every
// depth exactly ln V), which labels each depth reads, and a float64 gradient check of the
// combined loss with respect to every parameter of a tiny model with D = 2.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "meshtrain/core/block_name.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/model/counting.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

// dim 32, 1 dense + 1 MoE layer (so MTP module 1 is block 2, an MoE block), 4 experts top-2.
DeepSeekV3Args tiny_mtp_args(int mtp_layers) {
  DeepSeekV3Args a;
  a.vocab_size = 11;
  a.dim = 32;
  a.inter_dim = 48;
  a.moe_inter_dim = 16;
  a.n_layers = 2;
  a.n_dense_layers = 1;
  a.n_heads = 2;
  a.q_lora_rank = 0;
  a.kv_lora_rank = 16;
  a.qk_nope_head_dim = 8;
  a.qk_rope_head_dim = 4;
  a.v_head_dim = 8;
  a.moe.num_experts = 4;
  a.moe.num_shared_experts = 1;
  a.moe.top_k = 2;
  a.moe.score_func = "softmax";
  a.moe.token_group_alignment = 4;
  a.mtp_layers = mtp_layers;
  return a;
}

// One tiny model's forward (and, with `backward`, its gradients) in float64, on one rank.
struct Tiny {
  Graph g;
  ParallelPlan plan{
      {.master_dtype = DType::kF64, .compute_dtype = DType::kF64, .reduce_dtype = DType::kF64},
      nullptr};
  ModelInputs in;
  ModelLoss loss;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend = create_backend("cpu", 0);
  std::unique_ptr<Executor> ex;
  std::unique_ptr<ParamStore> store;
  int64_t B = 2, S = 6;

  Tiny(const DeepSeekV3Args& a, bool backward) {
    model = create_deepseek_v3(a, "tiny");
    Builder b(g);
    in = ModelInputs{b.input("tokens", {Shape{B, S}, DType::kI32}),
                     b.input("labels", {Shape{B, S}, DType::kI32}),
                     b.input("token_count", {Shape{1}, DType::kI64}), B, S};
    if (a.mtp_layers > 0) {
      in.mtp_token_count = b.input("mtp_token_count", {Shape{a.mtp_layers}, DType::kI64});
      in.mtp_loss_weight = b.input("mtp_loss_weight", {Shape{1}, DType::kF64});
    }
    loss = model->build_loss(b, plan, in);
    g.mark_output(loss.total);
    g.mark_output(loss.main);
    for (ValueId v : loss.mtp) g.mark_output(v);
    if (backward) {
      GradientMap grads = differentiate(g, loss.total, plan.trainable_masters());
      Builder bb(g, NodePhase::kBackward);
      plan.attach_gradients(bb, grads);
    }
    eliminate_dead_nodes(g);
    ex = std::make_unique<Executor>(g, plan_memory(g, DeviceType::kCPU), *backend, nullptr);
    store = std::make_unique<ParamStore>(plan, *backend);
    store->initialize(5);
    store->bind(*ex);
    ex->prepare();
    ex->tensor(in.token_count).data<int64_t>()[0] = B * S;
    for (int k = 1; k <= a.mtp_layers; ++k)
      ex->tensor(in.mtp_token_count).data<int64_t>()[k - 1] = mtp_valid_targets(B * S, S, k);
    if (a.mtp_layers > 0) ex->tensor(in.mtp_loss_weight).data<double>()[0] = 0.7;
  }
  void set_data(const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels) {
    std::copy(tokens.begin(), tokens.end(), ex->tensor(in.tokens).data<int32_t>());
    std::copy(labels.begin(), labels.end(), ex->tensor(in.labels).data<int32_t>());
  }
  double value(ValueId v) const { return ex->tensor(v).data<double>()[0]; }
};

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = int32_t(std::uniform_int_distribution<int>(0, vocab - 1)(rng));
  return v;
}

TEST(Mtp, RowShiftsRollTokensAndIgnoreTargetsPastTheRowEnd) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{2, 5}, DType::kI32});
  ValueId rolled = roll_rows_left(b, x, 2);
  ValueId shifted = shift_labels_left(b, x, 2);
  g.mark_output(rolled);
  g.mark_output(shifted);
  auto backend = create_backend("cpu", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *backend, nullptr);
  ex.prepare();
  const std::vector<int32_t> in = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14};
  std::copy(in.begin(), in.end(), ex.tensor(x).data<int32_t>());
  ex.run();
  EXPECT_EQ(ex.tensor(rolled).to_vector<int32_t>(),
            (std::vector<int32_t>{2, 3, 4, 0, 1, 12, 13, 14, 10, 11}));
  EXPECT_EQ(ex.tensor(shifted).to_vector<int32_t>(),
            (std::vector<int32_t>{2, 3, 4, -100, -100, 12, 13, 14, -100, -100}));
  EXPECT_EQ(mtp_valid_targets(10, 5, 2), 6);
  testing::expect_error(
      ErrorKind::kShape, [&] { roll_rows_left(b, x, 5); }, "shift 5 must be in [1, 5)");
}

TEST(Mtp, ModulesAreBlocksAfterTheMainStackWithTheReleaseNames) {
  Tiny t(tiny_mtp_args(2), false);
  EXPECT_EQ(t.model->mtp_layers(), 2);
  EXPECT_EQ(t.model->num_blocks(), 4);
  EXPECT_EQ(t.model->mtp_depth_of_block(1), 0);
  EXPECT_EQ(t.model->mtp_depth_of_block(2), 1);
  EXPECT_EQ(t.model->mtp_depth_of_block(3), 2);
  EXPECT_EQ(t.model->mtp_depth_of_block(4), 0);
  std::set<std::string> names;
  for (const ParamInfo& p : t.plan.params()) names.insert(p.name);
  for (const char* n :
       {"layers.2.enorm.weight", "layers.2.hnorm.weight", "layers.2.eh_proj.weight",
        "layers.2.final_norm.weight", "layers.2.attention_norm.weight", "layers.2.ffn_norm.weight",
        "layers.2.attention.wkv_a.weight", "layers.2.moe.experts.w1", "layers.3.eh_proj.weight",
        "layers.3.moe.router.gate.weight", "layers.3.final_norm.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  // The embedding and the head are the main model's: no copies.
  for (const std::string& n : names)
    EXPECT_TRUE(n.find("tok_embeddings") != 0 || n == "tok_embeddings.weight") << n;
  EXPECT_EQ(t.plan.info("layers.2.eh_proj.weight").global_shape, (Shape{32, 64}));
  // Both modules' MoE layers balance their own load, keyed by their block.
  std::set<int> lb_blocks;
  for (const LoadBalanceLayer& l : t.plan.load_balance_layers()) lb_blocks.insert(l.block);
  EXPECT_EQ(lb_blocks, (std::set<int>{1, 2, 3}));
  // Every node inside "layers.N" carries block N; the modules' losses come out in order.
  std::set<int> blocks;
  for (const Node& n : t.g.nodes()) {
    const auto parsed = parse_block_name(n.scope);
    EXPECT_EQ(n.block, parsed ? parsed->index : kNoBlock) << n.op << " at " << n.scope;
    if (n.block != kNoBlock) blocks.insert(n.block);
  }
  EXPECT_EQ(blocks, (std::set<int>{0, 1, 2, 3}));
  ASSERT_EQ(t.loss.mtp.size(), 2u);
  EXPECT_EQ(t.g.node(t.g.value(t.loss.mtp[1]).producer).block, 3);
}

// A zero head makes every logit 0: each valid target costs ln V, so each depth's loss is ln V
// exactly when its ignored positions are left out of both the sum and the count.
TEST(Mtp, EachDepthIsTheMeanOverItsOwnValidTargets) {
  Tiny t(tiny_mtp_args(3), false);
  std::mt19937_64 rng(3);
  t.set_data(random_ids(rng, t.B * t.S, 11), random_ids(rng, t.B * t.S, 11));
  Tensor w = t.store->master("output.weight");
  std::fill_n(w.data<double>(), w.numel(), 0.0);
  t.ex->run();
  const double ln_v = std::log(11.0);
  EXPECT_NEAR(t.value(t.loss.main), ln_v, 1e-14);
  ASSERT_EQ(t.loss.mtp.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(t.value(t.loss.mtp[k]), ln_v, 1e-14) << k + 1;
  EXPECT_NEAR(t.value(t.loss.total), ln_v + 0.7 * ln_v, 1e-13);
}

// Depth k at position i predicts labels[i + k]: depth 2 never reads the first two labels of a
// row and reads the last one; the main loss reads all of them.
TEST(Mtp, DepthKReadsTheLabelsKAhead) {
  Tiny t(tiny_mtp_args(2), false);
  std::mt19937_64 rng(4);
  const std::vector<int32_t> tokens = random_ids(rng, t.B * t.S, 11);
  std::vector<int32_t> labels = random_ids(rng, t.B * t.S, 11);
  auto run = [&](const std::vector<int32_t>& l) {
    t.set_data(tokens, l);
    t.ex->run();
    return std::vector<double>{t.value(t.loss.main), t.value(t.loss.mtp[0]),
                               t.value(t.loss.mtp[1])};
  };
  const std::vector<double> base = run(labels);
  std::vector<int32_t> first = labels;
  first[1] = (first[1] + 1) % 11;  // row 0, position 1: a target of main and depth 1 only
  const std::vector<double> f = run(first);
  EXPECT_NE(f[0], base[0]);
  EXPECT_NE(f[1], base[1]);
  EXPECT_EQ(f[2], base[2]);
  std::vector<int32_t> last = labels;
  last[size_t(t.S - 1)] = (last[size_t(t.S - 1)] + 1) % 11;  // row 0's last label: every depth
  const std::vector<double> l = run(last);
  for (int k = 0; k < 3; ++k) EXPECT_NE(l[size_t(k)], base[size_t(k)]) << k;
}

// The combined loss main + 0.7 · mean(CE_1, CE_2) through the real plan / autodiff / executor:
// every parameter's analytic gradient (the MTP modules', the shared embedding and head's)
// against central differences on its master values.
TEST(Mtp, GradCheckCombinedLossAllParametersFloat64) {
  Tiny t(tiny_mtp_args(2), true);
  std::mt19937_64 rng(1234);
  for (const ParamInfo& p : t.plan.params()) {
    Tensor m = t.store->master(p.name);
    double* v = m.data<double>();
    const bool norm = p.global_shape.rank() == 1;
    const double a = norm ? 0.2 : 1.0 / std::sqrt(double(p.global_shape.last()));
    for (int64_t i = 0; i < m.numel(); ++i)
      v[i] = (norm && p.trainable ? 1.0 : 0.0) + std::uniform_real_distribution<double>(-a, a)(rng);
    if (!p.trainable && p.name.find("expert_bias") == std::string::npos)
      std::fill_n(v, m.numel(), 0.0);  // token counters
  }
  t.set_data(random_ids(rng, t.B * t.S, 11), random_ids(rng, t.B * t.S, 11));
  t.ex->run();
  std::map<std::string, std::vector<double>> analytic_of;
  for (const ParamInfo& p : t.plan.params())
    if (p.trainable) analytic_of[p.name] = t.store->grad(p.name).to_vector<double>();
  const double eps = 1e-6;
  int checked = 0;
  for (const ParamInfo& p : t.plan.params()) {
    if (!p.trainable) continue;
    Tensor m = t.store->master(p.name);
    double* v = m.data<double>();
    double max_num = 0, max_diff = 0;
    for (int s = 0; s < std::min<int64_t>(m.numel(), 6); ++s) {
      const int64_t i = std::uniform_int_distribution<int64_t>(0, m.numel() - 1)(rng);
      const double orig = v[i];
      v[i] = orig + eps;
      t.ex->run();
      const double lp = t.value(t.loss.total);
      v[i] = orig - eps;
      t.ex->run();
      const double lm = t.value(t.loss.total);
      v[i] = orig;
      const double num = (lp - lm) / (2 * eps);
      max_num = std::max(max_num, std::abs(num));
      max_diff = std::max(max_diff, std::abs(num - analytic_of[p.name][size_t(i)]));
      ++checked;
    }
    EXPECT_GT(max_num, 1e-7) << p.name << ": no gradient reaches it";
    // Relative to the largest sampled gradient, above the differences' rounding floor (the loss
    // ~5 carries 1e-16 relative error, over 2·eps: ~5e-10; seen up to 7e-10).
    EXPECT_LE(max_diff, 1e-6 * max_num + 2e-9) << p.name << " (largest gradient " << max_num << ")";
  }
  EXPECT_GT(checked, 150);
}

// `plan`'s counts: the MTP block's parameters, one more head pass and one more attention per
// module in the FLOPs.
TEST(Mtp, CountsAddTheModulesAndOneHeadPassPerDepth) {
  auto counts = [](int mtp) {
    JobConfig cfg;
    cfg.model.name = "deepseek_v3";
    cfg.model.flavor = "debugmodel";
    cfg.model.n_layers = 2;
    cfg.model.mtp_layers = mtp;
    cfg.training.seq_len = 64;
    cfg.training.local_batch_size = 1;
    auto sg = build_step_graph(cfg, nullptr, {.tokenizer_vocab = 258});
    double mtp_active = 0;
    for (const ParamInfo& p : sg->plan->params()) {
      const auto b = parse_block_name(p.name);
      if (p.trainable && b && sg->model->mtp_depth_of_block(b->index) > 0)
        mtp_active += double(p.global_shape.numel()) * sg->model->active_fraction(p);
    }
    return std::make_pair(count_model(*sg->model, *sg->plan, 64), mtp_active);
  };
  const auto [c0, a0] = counts(0);
  const auto [c1, a1] = counts(1);
  EXPECT_EQ(c0.mtp_params, 0);
  EXPECT_EQ(a0, 0.0);
  EXPECT_GT(c1.mtp_params, 0);
  EXPECT_EQ(c1.total_params, c0.total_params + c1.mtp_params);
  const double head = 258.0 * 256;  // vocab × dim
  const double attention = 6.0 * 16 * (128 + 64 + 128) * 64;
  EXPECT_DOUBLE_EQ(c1.flops_per_token, c0.flops_per_token + 6 * (a1 + head) + attention);
}

}  // namespace
}  // namespace meshtrain
