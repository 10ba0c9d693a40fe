// RMSNorm over the last dim (torchtitan / Llama): y = x / sqrt(mean(x^2) + eps) * w.
// The forward saves nothing beyond its inputs: rmsnorm_backward recomputes 1/rms per row from x
// (one extra read of x, which is cheaper than keeping a rows-sized tensor alive across the step).
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// x [..., D], w [D] (same dtype) -> [..., D].
ValueId rmsnorm(Builder& b, ValueId x, ValueId w, double eps);

struct RmsNormGrads {
  ValueId dx;
  ValueId dw;
};
// The fused backward: dx [..., D] and dw [D] (dw summed over rows in row order).
RmsNormGrads rmsnorm_backward(Builder& b, ValueId x, ValueId w, ValueId dy, double eps);

}  // namespace meshtrain::ops
