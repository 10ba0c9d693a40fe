// Llama-3 style dense transformer (torchtitan's llama3): RMSNorm pre-norm blocks, GQA attention
// with Llama-3 scaled RoPE, SwiGLU feed-forward, untied output projection.
#pragma once

#include <optional>

#include "meshtrain/model/model.h"
#include "meshtrain/ops/rope.h"

namespace meshtrain {

struct Llama3Args {
  int64_t dim = 4096;
  int n_layers = 32;
  int n_heads = 32;
  int n_kv_heads = 0;      // 0 = n_heads
  int64_t vocab_size = 0;  // 0 = from the tokenizer
  int64_t multiple_of = 256;
  std::optional<double> ffn_dim_multiplier;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // "llama3" (torchtitan's: factor 8, low 1, high 4 over 8192 positions, the defaults of
  // ops::RopeConfig) or "none"; models read from an HF config.json may carry other values.
  std::string rope_scaling = "llama3";
  double rope_scale_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  int64_t ffn_hidden_dim = 0;  // 0 = from multiple_of and ffn_dim_multiplier (torchtitan's rule)
  bool depth_init = true;
  // Which CUDA kernels run attention ([model] attention_backend; the arithmetic is the same).
  ops::AttentionKernel attention_kernel = ops::AttentionKernel::kAuto;
  int64_t head_dim() const { return dim / n_heads; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t ffn_hidden() const;  // ffn_hidden_dim, else torchtitan's FeedForward hidden size rule
  ops::RopeConfig rope_config() const;
};

// Flavors with torchtitan's shapes (debugmodel, 8B, 70B, 405B) and meshtrain's test flavor "tiny".
Llama3Args llama3_flavor(const std::string& flavor);
std::vector<std::string> llama3_flavors();

std::unique_ptr<Model> create_llama3(const ModelOptions& options);
// A model from explicit args (HF config.json import, tests).
std::unique_ptr<Model> create_llama3(const Llama3Args& args, const std::string& flavor);
// The args a llama3 model was built with; nullptr when `model` is another family.
const Llama3Args* llama3_args_of(const Model& model);

}  // namespace meshtrain
