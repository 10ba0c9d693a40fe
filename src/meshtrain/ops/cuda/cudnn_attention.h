// cuDNN's fused flash attention (cuDNN 9 backend C API, no frontend headers): causal or full SDPA
// forward and backward for bf16 in meshtrain's layout (q [B,S,Hq,Dqk], lse [B,Hq,S] natural log of
// scale·qkᵀ), with execution plans built once per shape and cached. Only built with cuDNN found.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "meshtrain/ops/cuda/attention_kernels.h"

namespace meshtrain::cuda {

// The backward's dQ: kDeterministic makes cuDNN's Hopper kernel write dQ from one CTA per query
// block through its dP workspace (no atomics; frontend's "deterministic algorithm"; the workspace
// is B·H·S²·2 bytes, 2 GiB at B 4 S 4096 H 16); kAtomic accumulates dQ in an fp32 workspace
// buffer across key blocks: 8-13% faster on H100, and not bitwise repeatable at that shape
// although cuDNN's engine carries no NONDETERMINISTIC note (bench/kernels/NOTES.md).
enum class CudnnBwdMode { kDeterministic, kAtomic };

struct CudnnAttnPlanInfo {
  int64_t engine = -1;            // CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the finalised plan
  bool nondeterministic = false;  // the engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC
  size_t plan_workspace = 0;      // cuDNN's own scratch
  size_t workspace = 0;           // everything the caller must pass (plan + meshtrain's tensors)
};

// The cuDNN version loaded at run time (cudnnGetVersion), e.g. 91900.
int64_t cudnn_attention_version();

// Builds (first call for the shape) and returns the plan's facts. Throws CudaError naming the
// cuDNN call and its message when cuDNN rejects the graph (head dims, version, device). Shapes:
// bf16, heads_kv == heads_q, head dims multiples of 8 up to 256, 16-byte aligned pointers.
CudnnAttnPlanInfo cudnn_attention_fwd_plan(const AttnShape& s);
CudnnAttnPlanInfo cudnn_attention_bwd_plan(const AttnShape& s,
                                           CudnnBwdMode mode = CudnnBwdMode::kDeterministic);

// Launchers: raw device pointers in meshtrain's layout, `workspace` of at least the plan's
// `workspace` bytes, on `stream`. Scale and causality come from `s`.
void cudnn_attention_fwd(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
                         float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream);
void cudnn_attention_bwd(const AttnShape& s, const void* q, const void* k, const void* v,
                         const void* out, const float* lse, const void* dout, void* dq, void* dk,
                         void* dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         CudnnBwdMode mode = CudnnBwdMode::kDeterministic);

}  // namespace meshtrain::cuda
