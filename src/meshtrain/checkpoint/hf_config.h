// Hugging Face config.json <-> meshtrain model args, for LlamaForCausalLM (llama3) and
// DeepseekV3ForCausalLM / DeepseekV2ForCausalLM (deepseek_v3). The rule: reading accepts only what
// meshtrain computes the same way (anything else is a ConfigError naming the field and value);
// writing states what meshtrain computed, so HF semantics applied to the file give the same model.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/model/llama3.h"

namespace meshtrain {

struct HfModelConfig {
  std::string source;        // the config.json read, for messages
  std::string architecture;  // architectures[0]
  std::string model_name;    // meshtrain's [model] name: "llama3" | "deepseek_v3"
  Llama3Args llama;          // model_name == "llama3"
  DeepSeekV3Args deepseek;   // model_name == "deepseek_v3"
  bool tie_word_embeddings = false;
  // num_nextn_predict_layers: multi-token-prediction layers after the last one (loaded when
  // [model] mtp_layers equals it, skipped with a note when mtp_layers = 0).
  int64_t mtp_layers = 0;
  // quantization_config of an fp8 release: the weight_block_size of weight_scale_inv (0 = none).
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  int64_t num_layers() const;
};

// The config.json a path names: the file itself, or `config.json` inside a folder.
std::string hf_config_path(const std::string& path);
HfModelConfig parse_hf_config(const nlohmann::json& config, const std::string& source);
HfModelConfig read_hf_config(const std::string& path);

// A model with the dims of config.json; ModelOptions supplies meshtrain's own choices (vocab and
// layer overrides, load_balance_coeff, moe_top_k, router_zero_init), and its name must match.
std::unique_ptr<Model> create_model_from_hf(const HfModelConfig& hf, const ModelOptions& options);

// The config.json of a meshtrain model trained at seq_len with compute dtype `compute`, its
// weights stored as `torch_dtype`. A softmax router whose choice is the plain top-k (no groups,
// the expert bias all zero) is written as DeepSeek-V2's "greedy"; any other routing as "noaux_tc".
nlohmann::json hf_config_json(const Model& model, int64_t seq_len, DType compute,
                              const std::string& torch_dtype, bool expert_bias_zero);

// How config.json and the model meshtrain built differ: `errors` change what is computed (the
// first names a field with both values), `notes` only rounding (eps) or a documented rule.
struct HfConfigCheck {
  std::vector<std::string> errors;
  std::vector<std::string> notes;
};
HfConfigCheck check_hf_config(const HfModelConfig& hf, const Model& model, int64_t seq_len,
                              DType compute);
// ConfigError listing every error of check_hf_config; returns its notes (for the log).
std::vector<std::string> require_hf_config_match(const HfModelConfig& hf, const Model& model,
                                                 int64_t seq_len, DType compute);

}  // namespace meshtrain
