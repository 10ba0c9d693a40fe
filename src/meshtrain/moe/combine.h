// The inverse of moe_permute: expert-major rows back to token order, summed over each token's k
// choices, optionally weighted by the gate weights (torchtitan's combine: unsort, then the
// [1, k] x [k, D] product per token in float32 for bfloat16 data).
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// y [capacity, D], row_map [T, k] int32 (from moe_dispatch_plan), weights [T, k] or kNoValue
// -> [T, D] with out[t] = Σ_j weights[t, j] · y[row_map[t, j]]. Rows of y that no choice maps to
// are never read. Backward: dy = moe_permute(dout, row_map, capacity, weights);
// dweights = moe_row_dot(y, dout, row_map).
ValueId moe_combine(Builder& b, ValueId y, ValueId row_map, ValueId weights = kNoValue);

// perm [capacity, D], rows [T, D], row_map [T, k] -> [T, k]: <perm[row_map[t, j]], rows[t]>,
// accumulated in float64 on CPU; dtype of the route weights (float32 for bfloat16 data). The
// gradient of a gate weight; not differentiable itself.
ValueId moe_row_dot(Builder& b, ValueId perm, ValueId rows, ValueId row_map);

}  // namespace meshtrain::ops
