// Token permutation of a MoE layer: from the router's choices [T, k] to an expert-major row
// buffer of static capacity, in which expert e owns rows [start_e, start_e + count_e) (choices in
// token order, torchtitan's stable argsort) and each group is padded to `alignment` rows.
// Rule: padding rows and the slack after the last group are never read as data by any MoE op;
// ops that write such a buffer write zeros there.
//
// Expert parallelism slots in between moe_permute and the expert GEMMs: with alignment 1 the
// rows bound for each EP rank (a contiguous block of experts) are contiguous, their counts are
// the groups' sizes, so an all_to_all_v of these rows followed by a second local
// moe_dispatch_plan/moe_permute (by local expert, padded) feeds grouped_matmul unchanged.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// Rows an expert-major buffer needs for `choices` = T·k routed rows over `num_experts` groups
// padded to `alignment`: the worst case Σ_e round_up(n_e, a) <= T·k + E·(a − 1), rounded up to a.
int64_t moe_capacity(int64_t choices, int64_t num_experts, int64_t alignment);

struct DispatchPlan {
  ValueId row_map;   // [T, k] int32: the buffer row of each choice
  ValueId groups;    // [2, E] int32: row 0 = start row of each expert's group, row 1 = its count
  int64_t capacity;  // rows of the permuted buffer
};
// ids [T, k] int32 in [0, num_experts). Experts that receive no token get count 0.
DispatchPlan moe_dispatch_plan(Builder& b, ValueId ids, int64_t num_experts, int64_t alignment);

// x [T, D] -> [capacity, D] with row row_map[t, j] = x[t] (times weights[t, j] when weights is
// given: torchtitan's score_before_experts). weights [T, k]: x's dtype, or float32 for bfloat16 x.
// Backward: dx = moe_combine(dy, row_map, weights); dweights = moe_row_dot(dy, x, row_map).
ValueId moe_permute(Builder& b, ValueId x, const DispatchPlan& plan, ValueId weights = kNoValue);
ValueId moe_permute(Builder& b, ValueId x, ValueId row_map, int64_t capacity,
                    ValueId weights = kNoValue);

// Checks shared by the permutation ops (ShapeError naming the op and the mismatch).
void check_row_map(const TensorMeta& row_map, const char* op);
void check_route_weights(const TensorMeta& weights, const TensorMeta& row_map,
                         const TensorMeta& data, const char* op);

}  // namespace meshtrain::ops
