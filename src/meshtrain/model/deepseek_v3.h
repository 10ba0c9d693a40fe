// DeepSeek-V3 family (torchtitan's deepseek_v3): RMSNorm pre-norm blocks with Multi-head Latent
// Attention (low-rank q/kv projections, rope on a shared k_pe, YaRN), a dense SwiGLU FFN in the
// first n_dense_layers and a MoE elsewhere (float32 token-choice router with expert_bias, routed
// SwiGLU experts over grouped GEMMs, shared experts), untied output projection.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/model.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/moe/router.h"
#include "meshtrain/ops/rope.h"

namespace meshtrain {

struct DeepSeekV3MoEArgs {  // torchtitan's MoEArgs
  int64_t num_experts = 8;
  int64_t num_shared_experts = 1;
  std::string score_func = "sigmoid";
  bool route_norm = false;
  double route_scale = 1.0;
  bool score_before_experts = true;
  int64_t top_k = 1;
  int64_t num_expert_groups = 0;  // 0 = None (no group-limited routing)
  int64_t num_limited_groups = 0;
  double load_balance_coeff = 1e-3;  // 0 = the expert bias never moves
  bool router_zero_init = false;     // zero gate, random bias (tests: every token ties)
  // Rows of each expert's group are padded to a multiple of this (torchtitan's
  // TOKEN_GROUP_ALIGN_SIZE_M, what bf16 grouped GEMMs need), on every backend alike.
  int64_t token_group_alignment = 8;
  // Which CUDA kernels run the routed experts' grouped GEMMs, forward and backward ([model]
  // expert_gemm_backend; the arithmetic is the same).
  ops::ExpertGemmKernel expert_gemm_kernel = ops::ExpertGemmKernel::kAuto;
  ops::RouterConfig router_config() const;
};

struct DeepSeekV3Args {
  int64_t vocab_size = 102400;  // 0 = from the tokenizer
  int64_t dim = 2048;
  int64_t inter_dim = 10944;
  int64_t moe_inter_dim = 1408;
  int n_layers = 27;
  int n_dense_layers = 1;
  int n_heads = 16;
  double norm_eps = 1e-5;
  DeepSeekV3MoEArgs moe;
  // Which CUDA kernels run attention ([model] attention_backend; the arithmetic is the same).
  ops::AttentionKernel attention_kernel = ops::AttentionKernel::kAuto;
  // MLA
  int64_t q_lora_rank = 0;  // 0: one wq projection; > 0: wq_a -> q_norm -> wq_b
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  // YaRN
  int64_t original_seq_len = 4096;
  double rope_theta = 10000.0;
  double rope_factor = 40;
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 1.0;
  // Unset: YaRN applies when seq_len > original_seq_len (torchtitan's rule); models read from an
  // HF config.json set it (HF applies a yarn rope_scaling at every length).
  std::optional<bool> yarn_apply;
  // The final norm's eps; 0 = torch's default for the compute dtype (torchtitan's nn.RMSNorm(dim)).
  double final_norm_eps = 0;
  // Multi-token prediction (model/mtp.h): modules built after the main stack ([model]
  // mtp_layers), and what the release this flavor describes ships (its config.json's
  // num_nextn_predict_layers; informational, mtp_layers alone decides what is built).
  int mtp_layers = 0;
  int release_mtp_layers = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // qk_head_dim^-0.5, times mscale'^2 with mscale' = 0.1·mscale·ln(rope_factor) + 1 when YaRN
  // applies (torchtitan: seq_len > original_seq_len, max_seq_len being the training seq_len).
  double softmax_scale(int64_t seq_len) const;
  // YaRN on the rope part, applied when seq_len > original_seq_len (torchtitan's rule).
  ops::RopeConfig rope_config() const;
  // Block `layer` (an MTP module's too: its block index counts, as in the release) is MoE.
  bool is_moe_layer(int layer) const { return layer >= n_dense_layers; }
  // The main stack's blocks and then the MTP modules': module k (1..mtp_layers) is block
  // n_layers + k - 1 ("layers.<n_layers + k - 1>", the release's model.layers.{n_layers + k - 1}).
  int num_blocks() const { return n_layers + mtp_layers; }
  int mtp_block(int depth) const { return n_layers + depth - 1; }
  // The MTP depth of block `block` (1..mtp_layers), 0 for a block of the main stack.
  int mtp_depth_of_block(int block) const {
    return block >= n_layers && block < num_blocks() ? block - n_layers + 1 : 0;
  }
  // The eps the final norm uses in a run computing in `compute`.
  double final_eps(DType compute) const;
  // ConfigError naming the field when the shapes cannot work.
  void validate(const std::string& flavor) const;
};

// Flavors with torchtitan's shapes: debugmodel, 16B, 236B, 671B (release_mtp_layers: 671B ships
// one MTP module, DeepSeek-V3's num_nextn_predict_layers; the V2-shaped 16B and 236B none).
DeepSeekV3Args deepseek_v3_flavor(const std::string& flavor);
std::vector<std::string> deepseek_v3_flavors();

std::unique_ptr<Model> create_deepseek_v3(const ModelOptions& options);
// "block 27" / "blocks 27..28": where the MTP modules sit, for logs and `plan`.
std::string mtp_blocks_text(const DeepSeekV3Args& a);
// A model from explicit args (tests build tiny models this way).
std::unique_ptr<Model> create_deepseek_v3(const DeepSeekV3Args& args, const std::string& flavor);
// The args a deepseek_v3 model was built with; nullptr when `model` is another family.
const DeepSeekV3Args* deepseek_v3_args_of(const Model& model);

// The layer builders, on weights the caller provides (the model passes plan.param values; tests
// pass graph inputs). Unused optional weights are kNoValue.
struct MlaWeights {
  ValueId wq = kNoValue;                                        // q_lora_rank == 0
  ValueId wq_a = kNoValue, q_norm = kNoValue, wq_b = kNoValue;  // q_lora_rank > 0
  ValueId wkv_a = kNoValue, kv_norm = kNoValue, wkv_b = kNoValue, wo = kNoValue;
};
// x [B, S, dim] -> [B, S, dim]; rope_table from ops::rope_table(S, qk_rope_head_dim, ...).
// x [B, S, dim] -> [B, S, dim]. `heads` = the heads this rank computes (n_heads / tp; 0 = all):
// under tensor parallelism the output is a partial sum (row-parallel wo).
ValueId mla_forward(Builder& b, const DeepSeekV3Args& a, const MlaWeights& w, ValueId x,
                    ValueId rope_table, int64_t seq_len, int64_t heads = 0);

struct MoeWeights {
  ValueId gate = kNoValue;         // [E, dim], in the router dtype (float32, float64 runs: float64)
  ValueId expert_bias = kNoValue;  // [E], router dtype
  ValueId w1 = kNoValue, w2 = kNoValue, w3 = kNoValue;  // [E, hidden, dim], [E, dim, hidden], w1's
  ValueId shared_w1 = kNoValue, shared_w2 = kNoValue, shared_w3 = kNoValue;  // if shared experts
};
struct MoeOutputs {
  ValueId out;  // [T, dim]
  ValueId ids;  // [T, top_k] int32: the routing, for the load counters
};
// x [T, dim] in the compute dtype.
// With a plan whose ep group has more than one rank, the expert-major rows go through the plan's
// expert exchange so each rank runs its E / ep local experts (w1/w2/w3 are then local).
MoeOutputs moe_forward(Builder& b, const DeepSeekV3Args& a, const MoeWeights& w, ValueId x,
                       const ParallelPlan* plan = nullptr);

// The router computes in float32 (float64 in float64 runs) whatever the model's compute dtype.
DType router_dtype(DType compute_dtype);

}  // namespace meshtrain
