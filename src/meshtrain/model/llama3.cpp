// llama3 graph builder. Parameter names and initialisation follow torchtitan's llama3 exactly
// (depth-scaled init for wo/w2/w3, normal(1) embeddings, 3σ-truncated output projection).
#include "meshtrain/model/llama3.h"

#include <cmath>

#include "meshtrain/model/layers.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/embedding.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/rmsnorm.h"
#include "meshtrain/ops/rope.h"

namespace meshtrain {

int64_t Llama3Args::ffn_hidden() const {
  if (ffn_hidden_dim > 0) return ffn_hidden_dim;
  int64_t hidden = 4 * dim;
  hidden = int64_t(2 * hidden / 3);
  if (ffn_dim_multiplier) hidden = int64_t(*ffn_dim_multiplier * double(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

ops::RopeConfig Llama3Args::rope_config() const {
  ops::RopeConfig rc;
  rc.scaling = rope_scaling;
  rc.theta = rope_theta;
  rc.scale_factor = rope_scale_factor;
  rc.low_freq_factor = rope_low_freq_factor;
  rc.high_freq_factor = rope_high_freq_factor;
  rc.original_max_position_embeddings = rope_original_max_positions;
  return rc;
}

namespace {

// torchtitan's llama3 flavors, one row each, plus meshtrain's test flavor "tiny": odd sizes
// (dim 40, ffn 112) that do not divide by 3, so uneven FSDP shards are exercised; small enough
// for many ranks on two cores. vocab 0: the tokenizer's; kv heads 0: n_heads.
struct Llama3Flavor {
  const char* name;
  int64_t dim;
  int n_layers, n_heads, n_kv_heads;
  double ffn_dim_multiplier;  // 0: none
  int64_t multiple_of, vocab_size;
  double rope_theta;
};
// clang-format off
constexpr Llama3Flavor kFlavors[] = {
//  name          dim    layers heads kv  ffn_mult multiple_of vocab   rope_theta
  {"debugmodel",  256,   6,     16,   0,  0,       256,        0,      500000},
  {"tiny",        40,    2,     4,    0,  0,       16,         0,      500000},
  {"8B",          4096,  32,    32,   8,  1.3,     1024,       128256, 500000},
  {"70B",         8192,  80,    64,   8,  1.3,     4096,       128256, 500000},
  {"405B",        16384, 126,   128,  8,  1.2,     4096,       128256, 500000},
};
// clang-format on

}  // namespace

std::vector<std::string> llama3_flavors() { return flavor_names(kFlavors); }

Llama3Args llama3_flavor(const std::string& flavor) {
  const Llama3Flavor& f = flavor_row(kFlavors, flavor, "llama3");
  Llama3Args a;
  a.dim = f.dim;
  a.n_layers = f.n_layers;
  a.n_heads = f.n_heads;
  a.n_kv_heads = f.n_kv_heads;
  if (f.ffn_dim_multiplier > 0) a.ffn_dim_multiplier = f.ffn_dim_multiplier;
  a.multiple_of = f.multiple_of;
  a.vocab_size = f.vocab_size;
  a.rope_theta = f.rope_theta;
  return a;
}

namespace {

class Llama3 final : public Model {
 public:
  Llama3(Llama3Args args, std::string flavor) : a_(args), flavor_(std::move(flavor)) {}
  const Llama3Args& args() const { return a_; }
  std::string name() const override { return "llama3"; }
  std::string flavor() const override { return flavor_; }
  int64_t vocab_size() const override { return a_.vocab_size; }
  int n_layers() const override { return a_.n_layers; }
  std::string describe() const override {
    return fmt::format(
        "llama3 {}: dim {}, {} layers, {} heads ({} kv, head dim {}), ffn {}, vocab {}, rope "
        "theta {:g} ({} scaling)",
        flavor_, a_.dim, a_.n_layers, a_.n_heads, a_.kv_heads(), a_.head_dim(), a_.ffn_hidden(),
        a_.vocab_size, a_.rope_theta, a_.rope_scaling);
  }
  double attention_flops_per_token(int64_t seq_len) const override {
    return 6.0 * a_.n_layers * a_.n_heads * double(2 * a_.head_dim()) * double(seq_len);
  }
  ValueId build(Builder& b, ParallelPlan& plan, const ModelInputs& in) override;

 private:
  ValueId attention(Builder& b, ParallelPlan& plan, ValueId x, ValueId table, double init_std,
                    const ModelInputs& in);
  Llama3Args a_;
  std::string flavor_;
};

// Attention (and feed_forward, model/layers.h) take the residual stream's token shard x [T/tp, D]
// and return their output on the same shard: tp_enter gathers the tokens for the column-parallel
// projections, tp_exit reduce-scatters the row-parallel output (identities when tp = 1).
ValueId Llama3::attention(Builder& b, ParallelPlan& plan, ValueId x, ValueId table, double init_std,
                          const ModelInputs& in) {
  auto s = b.scope("attention");
  const int tp = plan.tp_degree();
  const int64_t hd = a_.head_dim();
  const int64_t hq = a_.n_heads / tp, hkv = a_.kv_heads() / tp;
  const int64_t B = in.batch, S = in.seq_len;
  const ParamOptions col{.tp = TpStyle::kColwise}, row{.tp = TpStyle::kRowwise};
  ValueId wq = scoped_param(b, plan, "wq.weight", {a_.n_heads * hd, a_.dim},
                            InitSpec::trunc_normal(0.02), col);
  ValueId wk = scoped_param(b, plan, "wk.weight", {a_.kv_heads() * hd, a_.dim},
                            InitSpec::trunc_normal(0.02), col);
  ValueId wv = scoped_param(b, plan, "wv.weight", {a_.kv_heads() * hd, a_.dim},
                            InitSpec::trunc_normal(0.02), col);
  ValueId wo = scoped_param(b, plan, "wo.weight", {a_.dim, a_.n_heads * hd},
                            InitSpec::trunc_normal(init_std), row);
  ValueId xf = plan.tp_enter(b, x);
  ValueId q = ops::reshape(b, ops::linear(b, xf, wq), Shape{B, S, hq, hd});
  ValueId k = ops::reshape(b, ops::linear(b, xf, wk), Shape{B, S, hkv, hd});
  ValueId v = ops::reshape(b, ops::linear(b, xf, wv), Shape{B, S, hkv, hd});
  q = ops::rope(b, q, table);
  k = ops::rope(b, k, table);
  ValueId o =
      ops::attention(b, q, k, v, 1.0 / std::sqrt(double(hd)), true, a_.attention_kernel).out;
  return plan.tp_exit(b, ops::linear(b, ops::reshape(b, o, Shape{B * S, hq * hd}), wo));
}

ValueId Llama3::build(Builder& b, ParallelPlan& plan, const ModelInputs& in) {
  const DType cdt = plan.config().compute_dtype;
  const int tp = plan.tp_degree();
  MT_CHECK_T(ConfigError, a_.n_heads % tp == 0 && a_.kv_heads() % tp == 0,
             "llama3 {}: n_heads {} and n_kv_heads {} must divide by tensor_parallel_degree {}",
             flavor_, a_.n_heads, a_.kv_heads(), tp);
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
  const ops::RopeConfig rc = a_.rope_config();
  // The rotation table is computed in float32 (float64 for float64 runs), like torchtitan's
  // complex64 freqs_cis.
  ValueId table = ops::rope_table(b, in.seq_len, a_.head_dim(), rc,
                                  cdt == DType::kF64 ? DType::kF64 : DType::kF32);
  for (int l = 0; l < a_.n_layers; ++l) {
    auto s = b.block(l);
    double init_std =
        a_.depth_init ? 0.02 / std::sqrt(2.0 * (l + 1)) : 0.02 / std::sqrt(2.0 * a_.n_layers);
    ValueId an =
        plan.param(b, b.current_scope() + ".attention_norm.weight", {a_.dim}, InitSpec::ones());
    ValueId x = ops::rmsnorm(b, h, an, a_.norm_eps);
    h = ops::add(b, h, attention(b, plan, x, table, init_std, in));
    ValueId fn = plan.param(b, b.current_scope() + ".ffn_norm.weight", {a_.dim}, InitSpec::ones());
    x = ops::rmsnorm(b, h, fn, a_.norm_eps);
    h = ops::add(b, h, feed_forward(b, plan, x, a_.dim, a_.ffn_hidden(), init_std));
  }
  ValueId nw = plan.param(b, "norm.weight", {a_.dim}, InitSpec::ones());
  h = ops::rmsnorm(b, h, nw, a_.norm_eps);
  const double out_std = 1.0 / std::sqrt(double(a_.dim));
  ValueId wout = plan.param(b, "output.weight", {a_.vocab_size, a_.dim},
                            InitSpec::trunc_normal(out_std, -3 * out_std, 3 * out_std));
  auto s = b.scope("output");
  // Logits of this rank's token shard only: [T/tp, vocab].
  return output_loss(b, h, wout, labels, in.token_count, in);
}

}  // namespace

std::unique_ptr<Model> create_llama3(const Llama3Args& a, const std::string& flavor) {
  MT_CHECK_T(ConfigError, a.dim % a.n_heads == 0 && a.n_heads % a.kv_heads() == 0,
             "llama3 {}: dim {} must divide by n_heads {} and n_heads by n_kv_heads {}", flavor,
             a.dim, a.n_heads, a.kv_heads());
  MT_CHECK_T(ConfigError, a.vocab_size > 0, "llama3 {}: vocab_size must be positive, found {}",
             flavor, a.vocab_size);
  ops::validate_rope_config(a.rope_config(), a.head_dim());
  return std::make_unique<Llama3>(a, flavor);
}

std::unique_ptr<Model> create_llama3(const ModelOptions& o) {
  MT_CHECK_T(ConfigError, o.mtp_layers == 0,
             "[model] mtp_layers = {}: multi-token prediction is a deepseek_v3 feature (its MTP "
             "modules are MLA + MoE blocks); llama3 has none, set [model] mtp_layers = 0",
             o.mtp_layers);
  Llama3Args a = llama3_flavor(o.flavor);
  a.vocab_size = resolve_vocab(o, a.vocab_size);
  if (o.n_layers_override > 0) a.n_layers = o.n_layers_override;
  a.attention_kernel = o.attention_kernel;
  return create_llama3(a, o.flavor);
}

const Llama3Args* llama3_args_of(const Model& model) {
  const auto* m = dynamic_cast<const Llama3*>(&model);
  return m ? &m->args() : nullptr;
}

}  // namespace meshtrain
