// linear_cross_entropy: the output head and the token-mean cross entropy as one op that never
// holds the [N, V] logits; rows go through in chunks of `chunk_rows`, so only a [chunk_rows, V]
// float32 block exists (the kernel's workspace). With `grads` the same pass writes the gradients of
// the loss for dloss = 1, and the backward rule only scales them by the incoming dloss (scale_by).
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

inline constexpr const char* kLinearCrossEntropyOp = "linear_cross_entropy";
inline constexpr const char* kScaleByOp = "scale_by";
inline constexpr const char* kScaleByAccumulateOp = "scale_by_accumulate";
inline constexpr int64_t kDefaultChunkRows = 2048;

struct LinearCrossEntropy {
  ValueId loss = kNoValue;  // [1]: Σ over rows whose label is not ignore_index / token_count
  ValueId dh = kNoValue;    // [N, D] in h's dtype: dloss/dh for dloss = 1 (kNoValue without grads)
  ValueId dw = kNoValue;    // [V, D], float32 for bf16 w: dloss/dw for dloss = 1 (or kNoValue)
};

// h [N, D] and w [V, D] (ops::linear's weight layout: logits = h wᵀ) of one floating dtype,
// labels [N] int32, token_count [1] int64. The loss is float32 for bf16 operands, else their dtype
// (cross_entropy's rule). Without `grads` the node has the loss as its only output (validation).
LinearCrossEntropy linear_cross_entropy(Builder& b, ValueId h, ValueId w, ValueId labels,
                                        ValueId token_count, bool grads = true,
                                        int64_t chunk_rows = kDefaultChunkRows,
                                        int64_t ignore_index = -100);

// out = x · s[0] in dtype `out` (x float32 or its own dtype; s [1] in the loss dtype): the fused
// op's gradients times the incoming dloss. Not differentiable (it lives in the backward only).
ValueId scale_by(Builder& b, ValueId x, ValueId s, DType out);
// dst (+)= x · s[0] in place (dst persistent, float32 or x's dtype; attr "overwrite": dst = ...):
// scale_by's accumulating form, which graph/passes/fuse_grad_matmul writes into gradient sinks.
void scale_by_accumulate(Builder& b, ValueId dst, ValueId x, ValueId s, bool overwrite);

// FLOPs of the fused op: the logits GEMM, and with grads the dh and dw GEMMs (2·N·V·D each).
int64_t linear_cross_entropy_flops(int64_t n, int64_t v, int64_t d, bool grads);

}  // namespace meshtrain::ops
