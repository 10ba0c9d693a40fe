// SwiGLU gating of the feed-forward block: silu(gate) * up, elementwise, same shapes. The
// backward is one fused pass producing both input gradients.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

ValueId swiglu(Builder& b, ValueId gate, ValueId up);

struct SwigluGrads {
  ValueId dgate;
  ValueId dup;
};
SwigluGrads swiglu_backward(Builder& b, ValueId gate, ValueId up, ValueId dy);

}  // namespace meshtrain::ops
