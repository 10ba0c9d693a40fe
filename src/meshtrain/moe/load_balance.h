// Auxiliary-loss-free load balancing of MoE layers (DeepSeek-V3, arXiv 2408.15664, as torchtitan
// does it): the forward counts the tokens routed to each expert into a persistent per-layer
// counter; after each optimizer step expert_bias += coeff · sign(mean − counts), re-centred to
// zero mean, and the counter is reset. Counts are float (exact up to 2^24 per expert and step)
// so data-parallel ranks can sum them with the float collectives before the update.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// ids [T, k] int32 -> [num_experts] of `dtype` (float32/float64): tokens routed to each expert.
ValueId moe_token_counts(Builder& b, ValueId ids, int64_t num_experts, DType dtype);

// In place, all [E] of one float dtype: bias += coeff · sign(mean(counts) − counts) minus its
// mean (coeff 0 leaves the bias alone); last_load = counts (what the metrics read); counter = 0.
// `counts` is the persistent counter itself on one rank, or its sum over the data-parallel
// ranks (an all_reduce of the counter) so every rank applies the same update.
void expert_bias_update(Builder& b, ValueId bias, ValueId counter, ValueId last_load, double coeff,
                        ValueId counts = kNoValue);

}  // namespace meshtrain::ops
