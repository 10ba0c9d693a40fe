// config.json parsing and writing. Every field meshtrain reads is checked for type and meaning; a
// field whose HF semantics meshtrain does not compute (another activation, a rope type, the V2
// group rule) is a ConfigError that names it, never a silent approximation.
#include "meshtrain/checkpoint/hf_config.h"

#include <cfloat>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"

namespace meshtrain {

using nlohmann::json;

int64_t HfModelConfig::num_layers() const {
  return model_name == "llama3" ? llama.n_layers : deepseek.n_layers;
}

std::string hf_config_path(const std::string& path) {
  namespace fs = std::filesystem;
  MT_CHECK_T(ConfigError, fs::exists(path), "HF config '{}' does not exist", path);
  const fs::path p = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  MT_CHECK_T(ConfigError, fs::is_regular_file(p), "HF folder '{}' has no config.json", path);
  return p.string();
}

namespace {

// Typed reads with the file and key in every message.
struct Reader {
  const json& j;
  const std::string& src;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t i(const char* k) const {
    MT_CHECK_T(ConfigError, has(k), "{}: config.json lacks {}", src, k);
    MT_CHECK_T(ConfigError, j[k].is_number_integer(), "{}: {} must be an integer, found {}", src, k,
               j[k].dump());
    return j[k].get<int64_t>();
  }
  int64_t i(const char* k, int64_t def) const { return has(k) ? i(k) : def; }
  double f(const json& o, const char* k, double def) const {
    if (!o.contains(k) || o[k].is_null()) return def;
    MT_CHECK_T(ConfigError, o[k].is_number(), "{}: {} must be a number, found {}", src, k,
               o[k].dump());
    return o[k].get<double>();
  }
  double f(const char* k, double def) const { return f(j, k, def); }
  bool b(const char* k, bool def) const {
    if (!has(k)) return def;
    MT_CHECK_T(ConfigError, j[k].is_boolean(), "{}: {} must be true or false, found {}", src, k,
               j[k].dump());
    return j[k].get<bool>();
  }
  std::string s(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    MT_CHECK_T(ConfigError, j[k].is_string(), "{}: {} must be a string, found {}", src, k,
               j[k].dump());
    return j[k].get<std::string>();
  }
  void require(bool ok, const char* k, const std::string& what) const {
    MT_CHECK_T(ConfigError, ok, "{}: {} = {}: {}", src, k, has(k) ? j[k].dump() : "(absent)", what);
  }
};

std::string rope_type(const json& rs) {
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) return rs["rope_type"];
  if (rs.contains("type") && rs["type"].is_string()) return rs["type"];
  return "default";
}

void parse_llama(const Reader& r, HfModelConfig& h) {
  Llama3Args& a = h.llama;
  a.dim = r.i("hidden_size");
  a.n_layers = int(r.i("num_hidden_layers"));
  a.n_heads = int(r.i("num_attention_heads"));
  a.n_kv_heads = int(r.i("num_key_value_heads", a.n_heads));
  r.require(a.n_heads > 0 && a.dim % a.n_heads == 0, "num_attention_heads",
            "must divide hidden_size");
  r.require(r.i("head_dim", a.dim / a.n_heads) == a.dim / a.n_heads, "head_dim",
            "meshtrain's llama3 uses hidden_size / num_attention_heads");
  a.ffn_hidden_dim = r.i("intermediate_size");
  a.vocab_size = r.i("vocab_size");
  a.norm_eps = r.f("rms_norm_eps", 1e-6);
  a.rope_theta = r.f("rope_theta", 10000.0);
  a.rope_scaling = "none";
  if (r.has("rope_scaling")) {
    const json& rs = r.j["rope_scaling"];
    const std::string t = rope_type(rs);
    r.require(t == "llama3" || t == "default", "rope_scaling",
              "meshtrain computes rope types default and llama3 only");
    if (t == "llama3") {
      a.rope_scaling = "llama3";
      a.rope_scale_factor = r.f(rs, "factor", 8.0);
      a.rope_low_freq_factor = r.f(rs, "low_freq_factor", 1.0);
      a.rope_high_freq_factor = r.f(rs, "high_freq_factor", 4.0);
      a.rope_original_max_positions = int64_t(r.f(rs, "original_max_position_embeddings", 8192));
    }
  }
  r.require(!r.b("attention_bias", false), "attention_bias", "meshtrain's llama3 has no biases");
  r.require(!r.b("mlp_bias", false), "mlp_bias", "meshtrain's llama3 has no biases");
}

void parse_deepseek(const Reader& r, HfModelConfig& h) {
  DeepSeekV3Args& a = h.deepseek;
  DeepSeekV3MoEArgs& m = a.moe;
  const bool v3 = h.architecture == "DeepseekV3ForCausalLM";
  a.vocab_size = r.i("vocab_size");
  a.dim = r.i("hidden_size");
  a.inter_dim = r.i("intermediate_size");
  a.moe_inter_dim = r.i("moe_intermediate_size");
  a.n_layers = int(r.i("num_hidden_layers"));
  a.n_dense_layers = int(r.i("first_k_dense_replace", 0));
  a.n_heads = int(r.i("num_attention_heads"));
  r.require(r.i("num_key_value_heads", a.n_heads) == a.n_heads, "num_key_value_heads",
            "MLA has as many key/value heads as query heads");
  r.require(r.i("moe_layer_freq", 1) == 1, "moe_layer_freq",
            "meshtrain puts a MoE in every layer after first_k_dense_replace");
  a.q_lora_rank = r.i("q_lora_rank", 0);
  a.kv_lora_rank = r.i("kv_lora_rank");
  a.qk_nope_head_dim = r.i("qk_nope_head_dim");
  a.qk_rope_head_dim = r.i("qk_rope_head_dim");
  a.v_head_dim = r.i("v_head_dim");
  a.norm_eps = r.f("rms_norm_eps", 1e-6);
  a.final_norm_eps = a.norm_eps;
  if (r.has("meshtrain")) a.final_norm_eps = r.f(r.j["meshtrain"], "final_norm_eps", a.norm_eps);
  m.num_experts = r.i("n_routed_experts");
  m.num_shared_experts = r.i("n_shared_experts", 0);
  m.top_k = r.i("num_experts_per_tok");
  m.score_func = r.s("scoring_func", v3 ? "sigmoid" : "softmax");
  r.require(m.score_func == "sigmoid" || m.score_func == "softmax", "scoring_func",
            "meshtrain routes with softmax or sigmoid scores");
  m.route_norm = r.b("norm_topk_prob", false);
  m.route_scale = r.f("routed_scaling_factor", 1.0);
  m.score_before_experts = false;
  const std::string method = r.s("topk_method", v3 ? "noaux_tc" : "greedy");
  r.require(method == "greedy" || method == "group_limited_greedy" || method == "noaux_tc",
            "topk_method", "expected greedy, group_limited_greedy or noaux_tc");
  const int64_t groups = r.i("n_group", 1), limited = r.i("topk_group", groups);
  const bool limiting = method != "greedy" && groups > 1 && limited < groups;
  r.require(!(limiting && method == "group_limited_greedy"), "topk_method",
            "DeepSeek-V2's group_limited_greedy scores a group by its best expert; meshtrain "
            "scores it by the sum of its two best biased scores (noaux_tc)");
  m.num_expert_groups = limiting ? groups : 0;
  m.num_limited_groups = limiting ? limited : 0;
  a.rope_theta = r.f("rope_theta", 10000.0);
  a.yarn_apply = false;
  if (r.has("rope_scaling")) {
    const json& rs = r.j["rope_scaling"];
    const std::string t = rope_type(rs);
    r.require(t == "yarn" || t == "default", "rope_scaling",
              "meshtrain's deepseek_v3 computes rope types default and yarn only");
    if (t == "yarn") {
      a.yarn_apply = true;
      a.rope_factor = r.f(rs, "factor", 1.0);
      a.beta_fast = r.f(rs, "beta_fast", 32.0);
      a.beta_slow = r.f(rs, "beta_slow", 1.0);
      a.original_seq_len = int64_t(
          r.f(rs, "original_max_position_embeddings", double(r.i("max_position_embeddings"))));
      const double ms = r.f(rs, "mscale", 0.0), all = r.f(rs, "mscale_all_dim", 0.0);
      // HF scales cos/sin by mscale'(mscale) / mscale'(mscale_all_dim) (mscale'(1) when either is
      // absent) and the softmax by mscale'(mscale_all_dim)^2; meshtrain does the latter only.
      r.require(ms != 0.0 && ms == all, "rope_scaling",
                fmt::format("meshtrain's YaRN scales the softmax by mscale_all_dim and leaves "
                            "cos/sin unscaled, which needs mscale == mscale_all_dim (found {} "
                            "and {})",
                            ms, all));
      a.mscale = all;
    }
  }
  r.require(r.b("rope_interleave", true), "rope_interleave",
            "meshtrain's rope rotates interleaved pairs, the layout of DeepSeek's release");
  r.require(!r.b("attention_bias", false), "attention_bias", "meshtrain's MLA has no biases");
  h.mtp_layers = r.i("num_nextn_predict_layers", 0);
  r.require(h.mtp_layers >= 0, "num_nextn_predict_layers", "must be 0 or more");
}

}  // namespace

HfModelConfig parse_hf_config(const json& j, const std::string& source) {
  MT_CHECK_T(ConfigError, j.is_object(), "{}: config.json must be a JSON object", source);
  const Reader r{j, source};
  HfModelConfig h;
  h.source = source;
  MT_CHECK_T(ConfigError,
             j.contains("architectures") && j["architectures"].is_array() &&
                 j["architectures"].size() == 1 && j["architectures"][0].is_string(),
             "{}: config.json needs \"architectures\": [one name], found {}", source,
             j.contains("architectures") ? j["architectures"].dump() : "(absent)");
  h.architecture = j["architectures"][0];
  if (h.architecture == "LlamaForCausalLM") {
    h.model_name = "llama3";
    parse_llama(r, h);
  } else if (h.architecture == "DeepseekV3ForCausalLM" ||
             h.architecture == "DeepseekV2ForCausalLM") {
    h.model_name = "deepseek_v3";
    parse_deepseek(r, h);
  } else {
    MT_THROW(ConfigError,
             "{}: architectures [\"{}\"] is not supported: meshtrain reads LlamaForCausalLM, "
             "DeepseekV3ForCausalLM and DeepseekV2ForCausalLM",
             source, h.architecture);
  }
  r.require(r.s("hidden_act", "silu") == "silu", "hidden_act",
            "meshtrain's FFNs are SwiGLU (silu)");
  h.tie_word_embeddings = r.b("tie_word_embeddings", false);
  if (r.has("quantization_config")) {
    const json& q = j["quantization_config"];
    const bool fp8 = q.value("quant_method", "") == "fp8" && q.value("fmt", "e4m3") == "e4m3" &&
                     q.contains("weight_block_size") && q["weight_block_size"].is_array() &&
                     q["weight_block_size"].size() == 2;
    r.require(fp8, "quantization_config",
              "meshtrain dequantises fp8 e4m3 block-quantised weights (weight_block_size [r, c]) "
              "only");
    h.fp8_block_rows = q["weight_block_size"][0].get<int64_t>();
    h.fp8_block_cols = q["weight_block_size"][1].get<int64_t>();
    r.require(h.fp8_block_rows > 0 && h.fp8_block_cols > 0, "quantization_config",
              "weight_block_size must be positive");
  }
  return h;
}

HfModelConfig read_hf_config(const std::string& path) {
  const std::string file = hf_config_path(path);
  std::ifstream in(file);
  MT_CHECK_T(IoError, in.good(), "cannot read '{}'", file);
  json j = json::parse(in, nullptr, false);
  MT_CHECK_T(ConfigError, !j.is_discarded(), "{}: not valid JSON", file);
  return parse_hf_config(j, file);
}

std::unique_ptr<Model> create_model_from_hf(const HfModelConfig& hf, const ModelOptions& o) {
  MT_CHECK_T(ConfigError, o.name == hf.model_name,
             "[model] name is \"{}\" but {} describes a {} ({})", o.name, hf.source, hf.model_name,
             hf.architecture);
  const std::string flavor = "hf:" + hf.source;
  if (hf.model_name == "llama3") {
    Llama3Args a = hf.llama;
    a.vocab_size = resolve_vocab(o, a.vocab_size);
    if (o.n_layers_override > 0) a.n_layers = o.n_layers_override;
    a.attention_kernel = o.attention_kernel;
    return create_llama3(a, flavor);
  }
  DeepSeekV3Args a = hf.deepseek;
  a.vocab_size = resolve_vocab(o, a.vocab_size);
  if (o.n_layers_override > 0) a.n_layers = o.n_layers_override;
  a.moe.load_balance_coeff = o.load_balance_coeff;
  if (o.moe_top_k > 0) a.moe.top_k = o.moe_top_k;
  a.moe.router_zero_init = o.router_zero_init;
  a.moe.expert_gemm_kernel = o.expert_gemm_kernel;
  a.attention_kernel = o.attention_kernel;
  // [model] mtp_layers decides the MTP modules, not num_nextn_predict_layers: a run may train
  // without the release's MTP layers (loading them is checked against mtp_layers).
  a.mtp_layers = o.mtp_layers;
  return create_deepseek_v3(a, flavor);
}

}  // namespace meshtrain
