// Model: a graph builder for one model family and flavor. `build` emits one micro-batch's
// forward graph on local shapes and returns the loss; it asks the ParallelPlan for every
// parameter and never names a backend or a collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ir/builder.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

struct ModelInputs {
  ValueId tokens = kNoValue;       // [B, S] int32
  ValueId labels = kNoValue;       // [B, S] int32
  ValueId token_count = kNoValue;  // [1] int64: tokens the loss is normalised by (global)
  int64_t batch = 0;               // local batch
  int64_t seq_len = 0;
  // Models with multi-token prediction (model/mtp.h) only, else kNoValue: the global number of
  // valid targets of each depth [mtp_layers] int64, and the weight of the mean MTP loss [1] in the
  // loss dtype (both written by the caller, like token_count).
  ValueId mtp_token_count = kNoValue;
  ValueId mtp_loss_weight = kNoValue;
  // How the output head meets the loss (model/layers.h output_loss): fused into one chunked op
  // ([model] fused_output_loss), and whether a backward will follow (false: validation's
  // forward-only graph, where the fused op computes the loss alone).
  bool fused_output_loss = true;
  int64_t output_loss_chunk_rows = ops::kDefaultChunkRows;  // [model] output_loss_chunk_rows
  bool loss_grads = true;
};

// The losses one micro-batch's forward emits, each a [1] value already divided by its global count.
struct ModelLoss {
  ValueId total = kNoValue;  // what training minimises (main + weight · mean of the MTP losses)
  ValueId main = kNoValue;   // the next-token cross entropy (the same value as total without MTP)
  std::vector<ValueId> mtp;  // depth 1..D: the cross entropy of the token k + 1 ahead
};

struct ModelOptions {
  std::string name;                  // "llama3" | "deepseek_v3"
  std::string flavor;                // "debugmodel", "8B", ...
  int64_t tokenizer_vocab = 0;       // vocab of the data's tokenizer
  std::string vocab_source;          // the file whose ids set tokenizer_vocab (for errors)
  int64_t vocab_override = 0;        // [model] vocab_size (0 = flavor's or tokenizer's)
  int n_layers_override = 0;         // [model] n_layers (0 = flavor's)
  int64_t seq_len = 0;               // [training] seq_len (rope tables, YaRN condition)
  double load_balance_coeff = 1e-3;  // [model] load_balance_coeff (MoE models; 0 = off)
  int64_t moe_top_k = 0;             // [model] moe_top_k (0 = flavor's)
  bool router_zero_init = false;     // [model] router_zero_init
  ops::AttentionKernel attention_kernel = ops::AttentionKernel::kAuto;  // [model] attention_backend
  // [model] expert_gemm_backend (MoE models)
  ops::ExpertGemmKernel expert_gemm_kernel = ops::ExpertGemmKernel::kAuto;
  int mtp_layers = 0;  // [model] mtp_layers: multi-token-prediction modules (deepseek_v3 only)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  virtual std::string flavor() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int n_layers() const = 0;  // the main stack's blocks
  // Multi-token-prediction modules after the main stack (model/mtp.h); 0 for models without.
  virtual int mtp_layers() const { return 0; }
  // Every transformer block the model emits: the main stack's, then one per MTP module (module k
  // is block n_layers() + k - 1, so passes and metrics treat it as a block).
  int num_blocks() const { return n_layers() + mtp_layers(); }
  // The MTP depth (1..mtp_layers()) of block `block`, 0 for a block of the main stack.
  int mtp_depth_of_block(int block) const {
    return block >= n_layers() && block < num_blocks() ? block - n_layers() + 1 : 0;
  }
  // One line for the start-up summary: the shapes that matter.
  virtual std::string describe() const = 0;
  // Emits the forward graph; returns the scalar loss (sum of token losses / token_count) that
  // training minimises (build_loss().total).
  virtual ValueId build(Builder& b, ParallelPlan& plan, const ModelInputs& in) = 0;
  // The same graph, with its parts: the main loss and each MTP depth's. Models without MTP
  // return build()'s loss as both total and main.
  virtual ModelLoss build_loss(Builder& b, ParallelPlan& plan, const ModelInputs& in) {
    const ValueId loss = build(b, plan, in);
    return {loss, loss, {}};
  }
  // Share of a parameter that one token uses (1 for dense; top_k / num_experts for routed
  // experts), for active-parameter counts and MFU.
  virtual double active_fraction(const ParamInfo& p) const { return 1.0; }
  // How many times one token's forward multiplies by a parameter, for FLOPs (the output head
  // shared by the MTP modules: 1 + mtp_layers; 1 for every other parameter).
  virtual double uses_per_token(const ParamInfo& p) const { return 1.0; }
  // The attention term of FLOPs per token (training: forward + backward), torchtitan's
  // convention: 6 · layers · heads · (d_qk + d_v) · seq_len (no causal discount).
  virtual double attention_flops_per_token(int64_t seq_len) const = 0;
};

// Flavor tables (one row per flavor, `name` first): the names in table order, and the row of
// `flavor`, or a ConfigError naming the family's flavors.
template <typename Row, size_t N>
std::vector<std::string> flavor_names(const Row (&rows)[N]) {
  std::vector<std::string> names;
  for (const Row& r : rows) names.push_back(r.name);
  return names;
}
template <typename Row, size_t N>
const Row& flavor_row(const Row (&rows)[N], const std::string& flavor, const char* family) {
  for (const Row& r : rows)
    if (flavor == r.name) return r;
  MT_THROW(ConfigError, "[model] flavor '{}' is not a {} flavor: expected one of {}", flavor,
           family, fmt::join(flavor_names(rows), ", "));
}

// Vocabulary resolution shared by model families: override > flavor > tokenizer.
int64_t resolve_vocab(const ModelOptions& o, int64_t flavor_vocab);

std::unique_ptr<Model> create_model(const ModelOptions& options);

}  // namespace meshtrain
