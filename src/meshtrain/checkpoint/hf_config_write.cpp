// config.json of a meshtrain model, and the field-by-field comparison of a config.json with the
// model meshtrain built. Both go through the effective values (what is computed at the training
// seq_len), so a flavor whose YaRN is off at this length matches a config without rope_scaling.
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

using nlohmann::json;

namespace {

struct Field {
  std::string key;
  std::string value;
  bool rounding_only = false;  // differences change rounding only: a note, not an error
};

std::string yarn_string(const DeepSeekV3Args& a) {
  return fmt::format(
      "yarn factor {} beta_fast {} beta_slow {} original_max_position_embeddings {} "
      "mscale {}",
      a.rope_factor, a.beta_fast, a.beta_slow, a.original_seq_len, a.mscale);
}

std::vector<Field> fields(const DeepSeekV3Args& a, int64_t seq_len, DType compute) {
  const DeepSeekV3MoEArgs& m = a.moe;
  auto str = [](auto v) { return fmt::format("{}", v); };
  const bool yarn = ops::yarn_applies(a.rope_config(), seq_len);
  return {
      {"hidden_size", str(a.dim)},
      {"num_hidden_layers", str(a.n_layers)},
      {"num_attention_heads", str(a.n_heads)},
      {"q_lora_rank", str(a.q_lora_rank)},
      {"kv_lora_rank", str(a.kv_lora_rank)},
      {"qk_nope_head_dim", str(a.qk_nope_head_dim)},
      {"qk_rope_head_dim", str(a.qk_rope_head_dim)},
      {"v_head_dim", str(a.v_head_dim)},
      {"intermediate_size", str(a.inter_dim)},
      {"moe_intermediate_size", str(a.moe_inter_dim)},
      {"first_k_dense_replace", str(std::min(a.n_dense_layers, a.n_layers))},
      {"n_routed_experts", str(m.num_experts)},
      {"n_shared_experts", str(m.num_shared_experts)},
      {"num_experts_per_tok", str(m.top_k)},
      {"scoring_func", m.score_func},
      {"norm_topk_prob", str(m.route_norm)},
      {"routed_scaling_factor", str(m.route_scale)},
      {"n_group/topk_group", m.num_expert_groups > 0
                                 ? fmt::format("{}/{}", m.num_expert_groups, m.num_limited_groups)
                                 : std::string("no group limit")},
      {"vocab_size", str(a.vocab_size)},
      {"rope_theta", str(a.rope_theta)},
      {"rope_scaling", yarn ? yarn_string(a) : std::string("none")},
      {"rms_norm_eps", str(a.norm_eps), true},
      {"final norm eps", str(a.final_eps(compute)), true},
  };
}

std::string llama_rope_string(const Llama3Args& a) {
  if (a.rope_scaling != "llama3") return "none";
  return fmt::format(
      "llama3 factor {} low_freq_factor {} high_freq_factor {} "
      "original_max_position_embeddings {}",
      a.rope_scale_factor, a.rope_low_freq_factor, a.rope_high_freq_factor,
      a.rope_original_max_positions);
}

std::vector<Field> fields(const Llama3Args& a) {
  auto str = [](auto v) { return fmt::format("{}", v); };
  return {
      {"hidden_size", str(a.dim)},
      {"num_hidden_layers", str(a.n_layers)},
      {"num_attention_heads", str(a.n_heads)},
      {"num_key_value_heads", str(a.kv_heads())},
      {"intermediate_size", str(a.ffn_hidden())},
      {"vocab_size", str(a.vocab_size)},
      {"rope_theta", str(a.rope_theta)},
      {"rope_scaling", llama_rope_string(a)},
      {"rms_norm_eps", str(a.norm_eps), true},
  };
}

json llama_json(const Llama3Args& a, int64_t seq_len) {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = a.dim;
  j["intermediate_size"] = a.ffn_hidden();
  j["num_hidden_layers"] = a.n_layers;
  j["num_attention_heads"] = a.n_heads;
  j["num_key_value_heads"] = a.kv_heads();
  j["head_dim"] = a.head_dim();
  j["rms_norm_eps"] = a.norm_eps;
  j["rope_theta"] = a.rope_theta;
  j["rope_scaling"] = nullptr;
  if (a.rope_scaling == "llama3")
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", a.rope_scale_factor},
                         {"low_freq_factor", a.rope_low_freq_factor},
                         {"high_freq_factor", a.rope_high_freq_factor},
                         {"original_max_position_embeddings", a.rope_original_max_positions}};
  j["max_position_embeddings"] = seq_len;
  j["vocab_size"] = a.vocab_size;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j;
}

json deepseek_json(const DeepSeekV3Args& a, int64_t seq_len, DType compute, bool bias_zero) {
  const DeepSeekV3MoEArgs& m = a.moe;
  MT_CHECK_T(
      ConfigError, !m.score_before_experts,
      "deepseek_v3: experts that see score-weighted inputs (score_before_experts) have no HF "
      "layout");
  const bool v3 = m.score_func == "sigmoid";
  json j;
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["vocab_size"] = a.vocab_size;
  j["hidden_size"] = a.dim;
  j["intermediate_size"] = a.inter_dim;
  j["moe_intermediate_size"] = a.moe_inter_dim;
  j["num_hidden_layers"] = a.n_layers;
  j["first_k_dense_replace"] = std::min(a.n_dense_layers, a.n_layers);
  j["moe_layer_freq"] = 1;
  j["num_attention_heads"] = a.n_heads;
  j["num_key_value_heads"] = a.n_heads;
  j["n_routed_experts"] = m.num_experts;
  j["n_shared_experts"] = m.num_shared_experts;
  j["num_experts_per_tok"] = m.top_k;
  j["scoring_func"] = m.score_func;
  // greedy (V2) is exactly meshtrain's choice only while the bias is zero and nothing is grouped.
  const bool greedy = !v3 && m.num_expert_groups == 0 && bias_zero;
  j["topk_method"] = greedy ? "greedy" : "noaux_tc";
  j["n_group"] = m.num_expert_groups > 0 ? m.num_expert_groups : 1;
  j["topk_group"] = m.num_expert_groups > 0 ? m.num_limited_groups : 1;
  j["norm_topk_prob"] = m.route_norm;
  j["routed_scaling_factor"] = m.route_scale;
  j["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["qk_nope_head_dim"] = a.qk_nope_head_dim;
  j["qk_rope_head_dim"] = a.qk_rope_head_dim;
  j["v_head_dim"] = a.v_head_dim;
  j["rms_norm_eps"] = a.norm_eps;
  j["rope_theta"] = a.rope_theta;
  j["rope_interleave"] = true;
  j["attention_bias"] = false;
  // The MTP modules are written as the release's model.layers.{n_layers + k - 1}.
  j["num_nextn_predict_layers"] = a.mtp_layers;
  // HF applies a yarn rope_scaling at every length: it is written only if meshtrain applied it.
  if (ops::yarn_applies(a.rope_config(), seq_len)) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"rope_type", "yarn"},
                         {"factor", a.rope_factor},
                         {"beta_fast", a.beta_fast},
                         {"beta_slow", a.beta_slow},
                         {"mscale", a.mscale},
                         {"mscale_all_dim", a.mscale},
                         {"original_max_position_embeddings", a.original_seq_len}};
    j["max_position_embeddings"] = int64_t(double(a.original_seq_len) * a.rope_factor);
  } else {
    j["rope_scaling"] = nullptr;
    j["max_position_embeddings"] = seq_len;
  }
  // torchtitan's final norm has torch's default eps, which no HF field holds.
  const double fe = a.final_eps(compute);
  if (fe != a.norm_eps) j["meshtrain"] = {{"final_norm_eps", fe}};
  return j;
}

// The folder's MTP layers against [model] mtp_layers: equal (loaded), or none in the model
// (skipped, one note), else an error naming both counts and the key.
void check_mtp_layers(const HfModelConfig& hf, const Model& model, HfConfigCheck& c) {
  const DeepSeekV3Args* d = deepseek_v3_args_of(model);
  const int64_t ours = d ? d->mtp_layers : 0;
  if (ours == hf.mtp_layers) return;
  if (ours == 0) {
    c.notes.push_back(fmt::format(
        "{} MTP layer{} (num_nextn_predict_layers = {}) {} not loaded: [model] mtp_layers = 0 "
        "(set [model] mtp_layers = {} to load and train them)",
        hf.mtp_layers, hf.mtp_layers == 1 ? "" : "s", hf.mtp_layers,
        hf.mtp_layers == 1 ? "was" : "were", hf.mtp_layers));
    return;
  }
  const std::string fix =
      hf.mtp_layers > 0
          ? fmt::format(
                "set [model] mtp_layers = {} to load the folder's MTP layers, or 0 to "
                "skip them",
                hf.mtp_layers)
          : std::string("the folder has no MTP layers to load: set [model] mtp_layers = 0");
  c.errors.push_back(
      fmt::format("num_nextn_predict_layers: config.json {}, meshtrain [model] mtp_layers {} ({})",
                  hf.mtp_layers, ours, fix));
}

std::vector<Field> fields_of(const Model& model, int64_t seq_len, DType compute) {
  if (const Llama3Args* l = llama3_args_of(model)) return fields(*l);
  if (const DeepSeekV3Args* d = deepseek_v3_args_of(model)) return fields(*d, seq_len, compute);
  MT_THROW(ConfigError, "model {} has no Hugging Face layout", model.name());
}

}  // namespace

json hf_config_json(const Model& model, int64_t seq_len, DType compute,
                    const std::string& torch_dtype, bool expert_bias_zero) {
  json j;
  if (const Llama3Args* l = llama3_args_of(model))
    j = llama_json(*l, seq_len);
  else if (const DeepSeekV3Args* d = deepseek_v3_args_of(model))
    j = deepseek_json(*d, seq_len, compute, expert_bias_zero);
  else
    MT_THROW(ConfigError, "model {} has no Hugging Face layout", model.name());
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = torch_dtype;
  j["initializer_range"] = 0.02;
  return j;
}

HfConfigCheck check_hf_config(const HfModelConfig& hf, const Model& model, int64_t seq_len,
                              DType compute) {
  HfConfigCheck c;
  if (hf.model_name != model.name()) {
    c.errors.push_back(fmt::format("architectures {} is a {} model, [model] name is {}",
                                   hf.architecture, hf.model_name, model.name()));
    return c;
  }
  const bool llama = hf.model_name == "llama3";
  const std::vector<Field> theirs =
      llama ? fields(hf.llama) : fields(hf.deepseek, seq_len, compute);
  const std::vector<Field> ours = fields_of(model, seq_len, compute);
  MT_CHECK(theirs.size() == ours.size(), "config fields of {} differ in number", hf.model_name);
  for (size_t i = 0; i < ours.size(); ++i) {
    if (theirs[i].value == ours[i].value) continue;
    std::string line = fmt::format("{}: config.json {}, meshtrain {}", ours[i].key, theirs[i].value,
                                   ours[i].value);
    const bool rule = !llama && ours[i].key == "rope_scaling" && ours[i].value == "none" &&
                      !deepseek_v3_args_of(model)->yarn_apply;
    if (rule) {
      line += fmt::format(
          " (HF applies YaRN at every length; meshtrain's flavor, like torchtitan, "
          "only when seq_len {} > original_seq_len {})",
          seq_len, deepseek_v3_args_of(model)->original_seq_len);
    }
    (ours[i].rounding_only || rule ? c.notes : c.errors).push_back(std::move(line));
  }
  if (hf.tie_word_embeddings)
    c.notes.push_back(
        "tie_word_embeddings: meshtrain trains lm_head untied (output.weight starts "
        "as a copy of embed_tokens)");
  check_mtp_layers(hf, model, c);
  return c;
}

std::vector<std::string> require_hf_config_match(const HfModelConfig& hf, const Model& model,
                                                 int64_t seq_len, DType compute) {
  HfConfigCheck c = check_hf_config(hf, model, seq_len, compute);
  MT_CHECK_T(ConfigError, c.errors.empty(),
             "{} does not describe the model meshtrain built ({}): {}", hf.source, model.describe(),
             fmt::join(c.errors, "; "));
  return c.notes;
}

}  // namespace meshtrain
