// Token-choice top-k routing of a MoE layer (torchtitan's TokenChoiceTopKRouter after the gate
// matmul), fused: scores = softmax or sigmoid of the gate logits; experts are chosen on
// scores + expert_bias (optionally only inside the best expert groups); the gate weights come
// from the unbiased scores, then route_norm and route_scale. Only the logits get a gradient.
#pragma once

#include <string>

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

struct RouterConfig {
  std::string score_func = "softmax";  // "softmax" | "sigmoid"
  int64_t top_k = 1;
  // Group-limited routing: experts are split into num_expert_groups equal groups; a group scores
  // the sum of its two best biased scores and only the best num_limited_groups groups are
  // eligible. 0 turns it off (torchtitan's None).
  int64_t num_expert_groups = 0;
  int64_t num_limited_groups = 0;
  bool route_norm = false;  // divide the k gate weights by their sum (+1e-20)
  double route_scale = 1.0;
};

// ConfigError naming the field when the config cannot route over `num_experts` experts.
void validate_router_config(const RouterConfig& cfg, int64_t num_experts);
RouterConfig router_config_from_attrs(const Attrs& attrs);

struct RouterOutputs {
  ValueId ids;      // [T, k] int32: chosen experts, by decreasing biased score
  ValueId weights;  // [T, k] logits' dtype: gate weight of each choice
};
// logits [T, E] float32/float64 (the gate matmul's output, in the router dtype), expert_bias
// [E] of the same dtype. Ties between equal biased scores (or equal group scores) go to the
// lower expert (group) id, so routing is deterministic.
RouterOutputs router(Builder& b, ValueId logits, ValueId expert_bias, const RouterConfig& cfg);

// d loss / d logits from d loss / d weights, for the experts `ids` chose (the choice itself is
// piecewise constant and has no gradient).
ValueId router_backward(Builder& b, ValueId logits, ValueId ids, ValueId dweights,
                        const RouterConfig& cfg);

}  // namespace meshtrain::ops
