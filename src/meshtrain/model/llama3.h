// Llama-3 style dense transformer (torchtitan's llama3): RMSNorm pre-norm blocks, GQA attention
// with Llama-3 scaled RoPE, SwiGLU feed-forward, untied output projection.
#pragma once

#include <optional>

#include "meshtrain/model/model.h"

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
  bool depth_init = true;
  int64_t head_dim() const { return dim / n_heads; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t ffn_hidden() const;  // torchtitan's FeedForward hidden size rule
};

// Flavors with torchtitan's shapes (debugmodel, 8B, 70B, 405B) and meshtrain's test flavor "tiny".
Llama3Args llama3_flavor(const std::string& flavor);
std::vector<std::string> llama3_flavors();

std::unique_ptr<Model> create_llama3(const ModelOptions& options);

}  // namespace meshtrain
