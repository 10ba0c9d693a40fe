// deepseek_v3 graph builder: flavors, parameter declarations and the model loop. Names and
// initialisation follow torchtitan's deepseek_v3 (v0.2): trunc_normal(0.02) projections, wo / w2
// / w3 / router gate at the depth-scaled 0.02/sqrt(2(l+1)), normal(1) embeddings, 3σ-truncated
// output projection; expert_bias and the token counters are float state buffers.
#include "meshtrain/model/deepseek_v3.h"

#include <cfloat>
#include <cmath>

#include "meshtrain/model/layers.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/moe/load_balance.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/embedding.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/rmsnorm.h"

namespace meshtrain {

namespace {

// torchtitan's deepseek_v3 flavors, one row each. Every flavor shares MLA's kv_lora_rank 512,
// qk_nope / qk_rope / v head dims 128 / 64 / 128, unnormalised routing (but 671B's) and scores
// applied after the experts. vocab 0 (debugmodel): torchtitan's test tokenizer has 2048, meshtrain
// takes the tokenizer's. groups 0: no group-limited routing. mtp: the MTP modules the release
// ships (DeepSeek-V3's config.json num_nextn_predict_layers 1; DeepSeek-V2 and V2-Lite have none).
struct DeepSeekV3Flavor {
  const char* name;
  int64_t vocab_size, dim, inter_dim, moe_inter_dim;
  int n_layers, n_dense_layers, n_heads;
  int64_t num_experts, num_shared_experts, top_k, num_expert_groups, num_limited_groups;
  const char* score_func;
  bool route_norm;
  double route_scale;
  int64_t q_lora_rank;
  double mscale;
  int mtp;  // MTP modules the release ships (config.json num_nextn_predict_layers)
};
// clang-format off
constexpr DeepSeekV3Flavor kFlavors[] = {
//  name          vocab   dim   inter  moe_inter layers dense heads experts shared top_k groups limited score      norm   scale q_lora mscale mtp
  {"debugmodel",  0,      256,  1024,  256,      6,     1,    16,   8,      2,     3,    0,     0,      "softmax", false, 1.0,  0,     0.70,  0},
  {"16B",         102400, 2048, 10944, 1408,     27,    1,    16,   64,     2,     6,    0,     0,      "softmax", false, 1.0,  0,     0.70,  0},
  {"236B",        102400, 5120, 12288, 1536,     60,    1,    128,  160,    2,     6,    8,     3,      "softmax", false, 16.0, 1536,  1.0,   0},
  {"671B",        129280, 7168, 18432, 2048,     61,    3,    128,  256,    1,     8,    8,     4,      "sigmoid", true,  2.5,  1536,  1.0,   1},
};
// clang-format on

}  // namespace

std::vector<std::string> deepseek_v3_flavors() { return flavor_names(kFlavors); }

DeepSeekV3Args deepseek_v3_flavor(const std::string& flavor) {
  const DeepSeekV3Flavor& f = flavor_row(kFlavors, flavor, "deepseek_v3");
  DeepSeekV3Args a;
  a.vocab_size = f.vocab_size;
  a.dim = f.dim;
  a.inter_dim = f.inter_dim;
  a.moe_inter_dim = f.moe_inter_dim;
  a.n_layers = f.n_layers;
  a.n_dense_layers = f.n_dense_layers;
  a.n_heads = f.n_heads;
  a.q_lora_rank = f.q_lora_rank;
  a.kv_lora_rank = 512;
  a.qk_nope_head_dim = 128;
  a.qk_rope_head_dim = 64;
  a.v_head_dim = 128;
  a.mscale = f.mscale;
  a.release_mtp_layers = f.mtp;
  a.moe = {.num_experts = f.num_experts,
           .num_shared_experts = f.num_shared_experts,
           .score_func = f.score_func,
           .route_norm = f.route_norm,
           .route_scale = f.route_scale,
           .score_before_experts = false,
           .top_k = f.top_k,
           .num_expert_groups = f.num_expert_groups,
           .num_limited_groups = f.num_limited_groups};
  return a;
}

void DeepSeekV3Args::validate(const std::string& flavor) const {
  auto positive = [&](int64_t v, const char* name) {
    MT_CHECK_T(ConfigError, v > 0, "deepseek_v3 {}: {} must be positive, found {}", flavor, name,
               v);
  };
  positive(dim, "dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(kv_lora_rank, "kv_lora_rank");
  positive(qk_nope_head_dim, "qk_nope_head_dim");
  positive(qk_rope_head_dim, "qk_rope_head_dim");
  positive(v_head_dim, "v_head_dim");
  positive(inter_dim, "inter_dim");
  positive(moe_inter_dim, "moe_inter_dim");
  positive(moe.token_group_alignment, "token_group_alignment");
  MT_CHECK_T(ConfigError, q_lora_rank >= 0, "deepseek_v3 {}: q_lora_rank must be >= 0, found {}",
             flavor, q_lora_rank);
  MT_CHECK_T(ConfigError, mtp_layers >= 0,
             "deepseek_v3 {}: mtp_layers must be >= 0 (0 = no multi-token prediction), found {}",
             flavor, mtp_layers);
  MT_CHECK_T(ConfigError, n_dense_layers >= 0,
             "deepseek_v3 {}: n_dense_layers must be >= 0, found {}", flavor, n_dense_layers);
  MT_CHECK_T(ConfigError, moe.num_shared_experts >= 0,
             "deepseek_v3 {}: num_shared_experts must be >= 0, found {}", flavor,
             moe.num_shared_experts);
  MT_CHECK_T(ConfigError, moe.load_balance_coeff >= 0,
             "deepseek_v3 {}: load_balance_coeff must be >= 0 (0 turns balancing off), found {}",
             flavor, moe.load_balance_coeff);
  ops::validate_router_config(moe.router_config(), moe.num_experts);
  ops::validate_rope_config(rope_config(), qk_rope_head_dim);
}

namespace {

// torchtitan's final norm is nn.RMSNorm(dim) without eps: torch then uses the machine epsilon
// of the input's dtype.
double torch_default_eps(DType d) {
  switch (d) {
    case DType::kF64: return DBL_EPSILON;
    case DType::kBF16: return 0.0078125;  // 2^-7
    default: return FLT_EPSILON;
  }
}

}  // namespace

double DeepSeekV3Args::final_eps(DType compute) const {
  return final_norm_eps > 0 ? final_norm_eps : torch_default_eps(compute);
}

namespace {

class DeepSeekV3 final : public Model {
 public:
  DeepSeekV3(DeepSeekV3Args args, std::string flavor)
      : a_(std::move(args)), flavor_(std::move(flavor)) {}
  const DeepSeekV3Args& args() const { return a_; }
  std::string name() const override { return "deepseek_v3"; }
  std::string flavor() const override { return flavor_; }
  int64_t vocab_size() const override { return a_.vocab_size; }
  int n_layers() const override { return a_.n_layers; }
  int mtp_layers() const override { return a_.mtp_layers; }
  std::string describe() const override;
  double active_fraction(const ParamInfo& p) const override {
    return p.kind == ParamKind::kExpert ? double(a_.moe.top_k) / double(a_.moe.num_experts) : 1.0;
  }
  // Every MTP depth runs the shared head once more.
  double uses_per_token(const ParamInfo& p) const override {
    return p.name == "output.weight" ? 1.0 + double(a_.mtp_layers) : 1.0;
  }
  // torchtitan's get_moe_model_nparams_and_flops: head_dims = qk_nope + qk_rope + v, over every
  // block with attention (the MTP modules' too).
  double attention_flops_per_token(int64_t seq_len) const override {
    return 6.0 * a_.num_blocks() * a_.n_heads * double(a_.qk_head_dim() + a_.v_head_dim) *
           double(seq_len);
  }
  ValueId build(Builder& b, ParallelPlan& plan, const ModelInputs& in) override {
    return build_loss(b, plan, in).total;
  }
  ModelLoss build_loss(Builder& b, ParallelPlan& plan, const ModelInputs& in) override;

 private:
  // Block `l` on the residual stream h, inside its open block scope: attention, then the dense
  // FFN or the MoE.
  ValueId block(Builder& b, ParallelPlan& plan, int l, ValueId h, ValueId table,
                const ModelInputs& in);
  ValueId attention(Builder& b, ParallelPlan& plan, ValueId x, ValueId table, double init_std,
                    const ModelInputs& in);
  ValueId moe(Builder& b, ParallelPlan& plan, ValueId x, double init_std);

  DeepSeekV3Args a_;
  std::string flavor_;
};

std::string DeepSeekV3::describe() const {
  const DeepSeekV3MoEArgs& m = a_.moe;
  std::string groups =
      m.num_expert_groups > 0
          ? fmt::format(", {} of {} groups", m.num_limited_groups, m.num_expert_groups)
          : std::string();
  const std::string yarn =
      !a_.yarn_apply
          ? fmt::format("YaRN factor {:g} beyond {}", a_.rope_factor, a_.original_seq_len)
      : *a_.yarn_apply ? fmt::format("YaRN factor {:g} over {} at every length", a_.rope_factor,
                                     a_.original_seq_len)
                       : std::string("no YaRN");
  // Multi-token prediction, when built or when the release ships it.
  const std::string mtp = a_.mtp_layers > 0
                              ? fmt::format(", MTP {} module{} ({})", a_.mtp_layers,
                                            a_.mtp_layers == 1 ? "" : "s", mtp_blocks_text(a_))
                          : a_.release_mtp_layers > 0
                              ? fmt::format(", no MTP (the release ships {}: [model] mtp_layers)",
                                            a_.release_mtp_layers)
                              : std::string();
  return fmt::format(
      "deepseek_v3 {}: dim {}, {} layers ({} dense, ffn {}), {} heads, MLA (q_lora {}, kv_lora {}, "
      "qk {}+{}, v {}), MoE {} experts top-{} {}{}{}{} + {} shared, hidden {}, load_balance_coeff "
      "{:g}, vocab {}, rope theta {:g} ({}){}",
      flavor_, a_.dim, a_.n_layers, std::min(a_.n_dense_layers, a_.n_layers), a_.inter_dim,
      a_.n_heads, a_.q_lora_rank, a_.kv_lora_rank, a_.qk_nope_head_dim, a_.qk_rope_head_dim,
      a_.v_head_dim, m.num_experts, m.top_k, m.score_func, m.route_norm ? " normed" : "",
      m.route_scale != 1.0 ? fmt::format(" ×{:g}", m.route_scale) : std::string(), groups,
      m.num_shared_experts, a_.moe_inter_dim, m.load_balance_coeff, a_.vocab_size, a_.rope_theta,
      yarn, mtp);
}

// Blocks take the residual stream's token shard x [T/tp, dim] and return on that shard:
// tp_enter gathers the tokens for the head-parallel projections, tp_exit reduce-scatters the
// row-parallel output (identities when tp = 1). Latent projections and norms stay replicated.
ValueId DeepSeekV3::attention(Builder& b, ParallelPlan& plan, ValueId x, ValueId table,
                              double init_std, const ModelInputs& in) {
  auto s = b.scope("attention");
  const InitSpec w02 = InitSpec::trunc_normal(0.02);
  const int64_t H = a_.n_heads, D = a_.dim;
  const ParamOptions col{.tp = TpStyle::kColwise}, row{.tp = TpStyle::kRowwise};
  MlaWeights w;
  if (a_.q_lora_rank == 0) {
    w.wq = scoped_param(b, plan, "wq.weight", {H * a_.qk_head_dim(), D}, w02, col);
  } else {
    w.wq_a = scoped_param(b, plan, "wq_a.weight", {a_.q_lora_rank, D}, w02);
    w.q_norm = scoped_param(b, plan, "q_norm.weight", {a_.q_lora_rank}, InitSpec::ones());
    w.wq_b = scoped_param(b, plan, "wq_b.weight", {H * a_.qk_head_dim(), a_.q_lora_rank}, w02, col);
  }
  w.wkv_a = scoped_param(b, plan, "wkv_a.weight", {a_.kv_lora_rank + a_.qk_rope_head_dim, D}, w02);
  w.kv_norm = scoped_param(b, plan, "kv_norm.weight", {a_.kv_lora_rank}, InitSpec::ones());
  w.wkv_b = scoped_param(b, plan, "wkv_b.weight",
                         {H * (a_.qk_nope_head_dim + a_.v_head_dim), a_.kv_lora_rank}, w02, col);
  w.wo = scoped_param(b, plan, "wo.weight", {D, H * a_.v_head_dim},
                      InitSpec::trunc_normal(init_std), row);
  ValueId xf = ops::reshape(b, plan.tp_enter(b, x), Shape{in.batch, in.seq_len, D});
  ValueId o = mla_forward(b, a_, w, xf, table, in.seq_len, H / plan.tp_degree());
  return plan.tp_exit(b, ops::reshape(b, o, Shape{in.batch * in.seq_len, D}));
}

ValueId DeepSeekV3::moe(Builder& b, ParallelPlan& plan, ValueId x, double init_std) {
  auto s = b.scope("moe");
  const std::string scope = b.current_scope();
  const DeepSeekV3MoEArgs& m = a_.moe;
  const int64_t E = m.num_experts, D = a_.dim, Hd = a_.moe_inter_dim;
  const DType rdt = router_dtype(plan.config().compute_dtype);
  // ETP = 1: experts see this rank's token shard (EP takes the tp ranks). ETP = tp: the experts
  // are column/row-parallel too, so the block runs on all tokens and ends with one tp_exit.
  const bool etp = plan.group_size(MeshGroup::kEtp) > 1;
  if (etp) x = plan.tp_enter(b, x);
  MoeWeights w;
  const ParamOptions ecol{.kind = ParamKind::kExpert, .tp = TpStyle::kColwise};
  const ParamOptions erow{.kind = ParamKind::kExpert, .tp = TpStyle::kRowwise};
  w.w1 = scoped_param(b, plan, "experts.w1", {E, Hd, D}, InitSpec::trunc_normal(0.02), ecol);
  w.w2 = scoped_param(b, plan, "experts.w2", {E, D, Hd}, InitSpec::trunc_normal(init_std), erow);
  w.w3 = scoped_param(b, plan, "experts.w3", {E, Hd, D}, InitSpec::trunc_normal(init_std), ecol);
  w.gate = scoped_param(b, plan, "router.gate.weight", {E, D},
                        m.router_zero_init ? InitSpec::zeros() : InitSpec::trunc_normal(init_std),
                        {.compute_dtype = rdt});
  if (m.num_shared_experts > 0) {
    const int64_t hs = Hd * m.num_shared_experts;
    const ParamOptions col{.tp = TpStyle::kColwise}, row{.tp = TpStyle::kRowwise};
    w.shared_w1 = scoped_param(b, plan, "shared_experts.w1.weight", {hs, D},
                               InitSpec::trunc_normal(0.02), col);
    w.shared_w2 = scoped_param(b, plan, "shared_experts.w2.weight", {D, hs},
                               InitSpec::trunc_normal(init_std), row);
    w.shared_w3 = scoped_param(b, plan, "shared_experts.w3.weight", {hs, D},
                               InitSpec::trunc_normal(init_std), col);
  }
  // Load balancing state: the bias the router adds, the forward's counter (summed over the
  // micro-batches of a step) and the last step's counts for the metrics.
  LoadBalanceLayer lb{.layer = scope,
                      .block = b.current_block(),
                      .expert_bias = scope + ".expert_bias",
                      .tokens_per_expert = scope + ".tokens_per_expert",
                      .last_load = scope + ".tokens_per_expert_last_step",
                      .num_experts = E,
                      .coeff = m.load_balance_coeff};
  // With a zero gate every score ties, so the bias alone picks the one expert all tokens go to and
  // orders the rest. A zero bias would leave the order to the experts' index, and then to the
  // last bits of the gate rows (the softmax gives every unchosen row the same gradient, which an
  // NCCL reduce-scatter sums in a different order on each shard): routing would depend on the
  // reduction order. Gaps of ~1e-3 between the biases make it depend on the model only.
  w.expert_bias = plan.buffer(b, lb.expert_bias, {E}, rdt,
                              m.router_zero_init ? InitSpec::normal(1e-2) : InitSpec::zeros());
  ValueId counter = plan.buffer(b, lb.tokens_per_expert, {E}, rdt, InitSpec::zeros());
  plan.buffer(b, lb.last_load, {E}, rdt, InitSpec::zeros());
  plan.add_load_balance_layer(lb);

  // ETP = 1 with tp > 1: the routed experts see the token shard but the shared experts are
  // tensor-parallel, so they run on all tokens between their own tp_enter / tp_exit.
  ValueId shared = kNoValue;
  if (!etp && plan.tp_degree() > 1 && w.shared_w1 != kNoValue) {
    auto ss = b.scope("shared_experts");
    shared =
        plan.tp_exit(b, swiglu_mlp(b, plan.tp_enter(b, x), w.shared_w1, w.shared_w2, w.shared_w3));
    w.shared_w1 = w.shared_w2 = w.shared_w3 = kNoValue;
  }
  MoeOutputs o = moe_forward(b, a_, w, x, &plan);
  ops::accumulate(b, counter, ops::moe_token_counts(b, o.ids, E, rdt));
  if (shared != kNoValue) return ops::add(b, o.out, shared);
  return etp ? plan.tp_exit(b, o.out) : o.out;
}

ModelLoss DeepSeekV3::build_loss(Builder& b, ParallelPlan& plan, const ModelInputs& in) {
  const int tp = plan.tp_degree();
  MT_CHECK_T(ConfigError, a_.n_heads % tp == 0,
             "deepseek_v3 {}: n_heads {} must divide by tensor_parallel_degree {}", flavor_,
             a_.n_heads, tp);
  const DType cdt = plan.config().compute_dtype;
  const int64_t T = in.batch * in.seq_len;
  // The residual stream is [tokens, dim] on this rank's token shard (sequence parallel).
  ValueId tokens = plan.shard_tokens(b, ops::reshape(b, in.tokens, Shape{T}));
  ValueId labels = plan.shard_tokens(b, ops::reshape(b, in.labels, Shape{T}));
  ValueId emb =
      plan.param(b, "tok_embeddings.weight", {a_.vocab_size, a_.dim}, InitSpec::normal(1.0));
  ValueId h;
  {
    auto s = b.scope("tok_embeddings");
    h = ops::embedding(b, tokens, emb);
  }
  // The rotation table (float32, float64 for float64 runs) covers the rope part of q and k.
  ValueId table = ops::rope_table(b, in.seq_len, a_.qk_rope_head_dim, a_.rope_config(),
                                  cdt == DType::kF64 ? DType::kF64 : DType::kF32);
  for (int l = 0; l < a_.n_layers; ++l) {
    auto s = b.block(l);
    h = block(b, plan, l, h, table, in);
  }
  ValueId nw = plan.param(b, "norm.weight", {a_.dim}, InitSpec::ones());
  const ValueId hidden = h;  // before the final norm: what the first MTP module reads
  h = ops::rmsnorm(b, h, nw, a_.final_eps(cdt));
  const double out_std = 1.0 / std::sqrt(double(a_.dim));
  ValueId wout = plan.param(b, "output.weight", {a_.vocab_size, a_.dim},
                            InitSpec::trunc_normal(out_std, -3 * out_std, 3 * out_std));
  ValueId loss;
  {
    auto s = b.scope("output");
    // Logits of this rank's token shard only: [T/tp, vocab].
    loss = output_loss(b, h, wout, labels, in.token_count, in);
  }
  return add_mtp_modules(b, plan, a_, in, {.hidden = hidden, .embedding = emb, .output = wout},
                         loss, [&](int l, ValueId x) { return block(b, plan, l, x, table, in); });
}

ValueId DeepSeekV3::block(Builder& b, ParallelPlan& plan, int l, ValueId h, ValueId table,
                          const ModelInputs& in) {
  const double init_std = 0.02 / std::sqrt(2.0 * (l + 1));
  ValueId an =
      plan.param(b, b.current_scope() + ".attention_norm.weight", {a_.dim}, InitSpec::ones());
  h = ops::add(b, h, attention(b, plan, ops::rmsnorm(b, h, an, a_.norm_eps), table, init_std, in));
  ValueId fn = plan.param(b, b.current_scope() + ".ffn_norm.weight", {a_.dim}, InitSpec::ones());
  ValueId x = ops::rmsnorm(b, h, fn, a_.norm_eps);
  return ops::add(b, h,
                  a_.is_moe_layer(l) ? moe(b, plan, x, init_std)
                                     : feed_forward(b, plan, x, a_.dim, a_.inter_dim, init_std));
}

}  // namespace

std::unique_ptr<Model> create_deepseek_v3(const DeepSeekV3Args& args, const std::string& flavor) {
  args.validate(flavor);
  MT_CHECK_T(ConfigError, args.vocab_size > 0,
             "deepseek_v3 {}: vocab_size must be positive, found {}", flavor, args.vocab_size);
  return std::make_unique<DeepSeekV3>(args, flavor);
}

std::string mtp_blocks_text(const DeepSeekV3Args& a) {
  return a.mtp_layers == 1 ? fmt::format("block {}", a.n_layers)
                           : fmt::format("blocks {}..{}", a.n_layers, a.num_blocks() - 1);
}

const DeepSeekV3Args* deepseek_v3_args_of(const Model& model) {
  const auto* m = dynamic_cast<const DeepSeekV3*>(&model);
  return m ? &m->args() : nullptr;
}

std::unique_ptr<Model> create_deepseek_v3(const ModelOptions& o) {
  DeepSeekV3Args a = deepseek_v3_flavor(o.flavor);
  a.vocab_size = resolve_vocab(o, a.vocab_size);
  if (o.n_layers_override > 0) a.n_layers = o.n_layers_override;
  a.moe.load_balance_coeff = o.load_balance_coeff;
  if (o.moe_top_k > 0) a.moe.top_k = o.moe_top_k;
  a.moe.router_zero_init = o.router_zero_init;
  a.moe.expert_gemm_kernel = o.expert_gemm_kernel;
  a.attention_kernel = o.attention_kernel;
  a.mtp_layers = o.mtp_layers;
  return create_deepseek_v3(a, o.flavor);
}

}  // namespace meshtrain
