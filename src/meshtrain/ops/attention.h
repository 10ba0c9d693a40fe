// Scaled-dot-product attention in flash-attention layout: q [B,S,Hq,Dqk], k [B,S,Hkv,Dqk],
// v [B,S,Hkv,Dv]. Dqk may differ from Dv (DeepSeek MLA); GQA maps q head h to kv head
// h / (Hq / Hkv). The forward also returns the per-row logsumexp, which the backward uses to
// recompute the probabilities instead of saving them.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// The op names, for the tables keyed by op (the cost model's throughput rates).
inline constexpr const char* kAttentionOp = "attention";
inline constexpr const char* kAttentionBackwardOp = "attention_backward";

// Which kernels run `attention` and its backward on CUDA ([model] attention_backend): kAuto takes
// cuDNN's fused attention where the build has it and cuDNN accepts the shape (bf16, equal q and kv
// heads), else meshtrain's own kernels; kCudnn insists (an unsupported node is an error naming
// it); kMeshtrain always runs meshtrain's. The CPU kernels ignore it: every choice computes the
// same function.
enum class AttentionKernel : int64_t { kAuto = 0, kCudnn = 1, kMeshtrain = 2 };
const char* attention_kernel_name(AttentionKernel k);  // "auto" | "cudnn" | "meshtrain"
AttentionKernel attention_kernel_of(const Attrs& attrs);

struct AttentionOutputs {
  ValueId out;  // [B, S, Hq, Dv], q's dtype
  ValueId lse;  // [B, Hq, S]: float32 for float32/bf16 inputs, float64 for float64
};
AttentionOutputs attention(Builder& b, ValueId q, ValueId k, ValueId v, double softmax_scale,
                           bool causal = true, AttentionKernel kernel = AttentionKernel::kAuto);

struct AttentionGrads {
  ValueId dq, dk, dv;
};
// The fused backward: D_i = rowsum(dout * out), P = exp(scale q k^T - lse), dS = P (dP - D).
AttentionGrads attention_backward(Builder& b, ValueId q, ValueId k, ValueId v, ValueId out,
                                  ValueId lse, ValueId dout, double softmax_scale, bool causal,
                                  AttentionKernel kernel = AttentionKernel::kAuto);

struct AttentionDims {
  int64_t batch, seq, heads_q, heads_kv, dim_qk, dim_v;
};
// Checks q, k, v against each other (ShapeError naming the mismatch) and returns the extents.
AttentionDims attention_dims(const TensorMeta& q, const TensorMeta& k, const TensorMeta& v);
DType attention_lse_dtype(DType input);

}  // namespace meshtrain::ops
