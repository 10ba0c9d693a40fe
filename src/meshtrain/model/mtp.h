// DeepSeek-V3's multi-token prediction (the report's §2.2 and the release's MTP layers): after
// the main stack, D sequential modules; module k predicts the token k + 1 ahead of each position
// from the previous depth's hidden state and the embedding of the token k ahead. Built from
// existing ops only (slice, concat, fill, embedding, rmsnorm, matmul, cross_entropy).
#pragma once

#include <functional>

#include "meshtrain/model/deepseek_v3.h"

namespace meshtrain {

// What a module shares with the main model, as the model computes with it.
struct MtpShared {
  ValueId hidden = kNoValue;     // the main stack's last hidden state BEFORE its final norm
  ValueId embedding = kNoValue;  // tok_embeddings.weight
  ValueId output = kNoValue;     // output.weight (the head every depth shares)
};

// Emits one ordinary transformer block (attention, then dense FFN or MoE by the block index)
// of block `block` on the residual stream x [T/tp, dim], inside that block's open scope.
using MtpBlockFn = std::function<ValueId(int block, ValueId x)>;

// Module k = 1..a.mtp_layers, in block a.mtp_block(k) (Node::block and the names
// "layers.<n_layers + k - 1>.*"), as the release computes it:
//   e   = enorm(Emb(tokens rolled left by k inside each row))
//   x   = eh_proj(concat([e, hnorm(h_{k-1})], -1))      eh_proj: [dim, 2·dim], no bias
//   h_k = block(x)                       h_0 = shared.hidden
//   CE_k = cross_entropy(output(final_norm(h_k)), labels shifted left by k)
// Positions whose shifted target falls off the row end (the last k of each row) are ignored;
// meshtrain packs documents without masking attention across them, so no other target is. CE_k
// is divided by in.mtp_token_count[k - 1], the global count of depth k's valid targets.
// Returns {main + in.mtp_loss_weight · mean_k CE_k, main, [CE_1 .. CE_D]}.
ModelLoss add_mtp_modules(Builder& b, ParallelPlan& plan, const DeepSeekV3Args& a,
                          const ModelInputs& in, const MtpShared& shared, ValueId main_loss,
                          const MtpBlockFn& block);

// x [B, S] -> [B, S] with position i holding x[(i + k) mod S] of its own row.
ValueId roll_rows_left(Builder& b, ValueId x, int64_t k);
// labels [B, S] int32 -> position i holds labels[i + k] of its row, the last k positions
// ignore_index.
ValueId shift_labels_left(Builder& b, ValueId labels, int64_t k, int64_t ignore_index = -100);
// Valid targets of depth k among `targets` main targets packed in rows of seq_len: k fewer per row.
int64_t mtp_valid_targets(int64_t targets, int64_t seq_len, int depth);

}  // namespace meshtrain
