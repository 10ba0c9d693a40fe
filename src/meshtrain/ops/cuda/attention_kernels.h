// Launchers of the CUDA attention kernels (flash layout: q [B,S,Hq,Dqk], k [B,S,Hkv,Dqk],
// v [B,S,Hkv,Dv], out [B,S,Hq,Dv], lse [B,Hq,S] natural log). They take raw device pointers,
// extents and a stream; shape, dtype and alignment checks happen once, in ops/cuda/attention.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace meshtrain::cuda {

struct AttnShape {
  int64_t batch = 0, seq = 0, heads_q = 0, heads_kv = 0, dim_qk = 0, dim_v = 0;
  double scale = 1.0;  // > 0
  bool causal = true;
};

// ---- bf16 tensor-core path (mma.sync m16n8k16, fp32 accumulation) -------------------------------
// Head-dim pairs (Dqk, Dv) with compiled kernels: (192,128), (128,128), (64,64). The launchers
// return false (launching nothing) for any other pair. Pointers must be 16-byte aligned.
// `variant` picks a compiled tile shape (benchmarks); 0 is the default.
bool attention_fwd_bf16(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
                        float* lse, cudaStream_t stream, int variant = 0);
int attention_fwd_bf16_num_variants(int64_t dim_qk, int64_t dim_v);
// nullptr when out of range.
const char* attention_fwd_bf16_variant_name(int64_t dim_qk, int64_t dim_v, int variant);

// ---- bf16 forward on Hopper's asynchronous path (TMA, mbarriers, wgmma; sm_90 devices) ---------
// (Dqk, Dv) in {(192, 128), (128, 128)}, any seq, GQA (heads_q a multiple of heads_kv), causal or
// not. Returns false, launching nothing, when the device is not compute capability 9.0, the head
// dims have no kernel or a pointer is not 16-byte aligned; callers then run attention_fwd_bf16.
// Same outputs as attention_fwd_bf16 up to fp32 summation order. `variant` as above.
bool attention_fwd_bf16_sm90(const AttnShape& s, const void* q, const void* k, const void* v,
                             void* out, float* lse, cudaStream_t stream, int variant = 0);
// Whether attention_fwd_bf16_sm90 takes the shape on the current device (pointers aside).
bool attention_fwd_bf16_sm90_supports(const AttnShape& s);
int attention_fwd_bf16_sm90_num_variants(int64_t dim_qk, int64_t dim_v);
const char* attention_fwd_bf16_sm90_variant_name(int64_t dim_qk, int64_t dim_v, int variant);

// dq, dk, dv (bf16). `delta` is workspace for D = rowsum(dout * out): B*Hq*S floats. Deterministic:
// each dq/dk/dv element is written by one CTA that sums in a fixed order (no atomics).
// Three passes: delta, dK/dV (one CTA per key block), dQ (one CTA per query block; it recomputes
// the scores instead of accumulating dQ across key blocks with atomics). `passes` lets benchmarks
// time them one at a time; everything else runs kAll.
enum class AttnBwdPasses { kAll, kDelta, kDkdv, kDq };
bool attention_bwd_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, const void* dout, void* dq, void* dk,
                        void* dv, float* delta, cudaStream_t stream,
                        AttnBwdPasses passes = AttnBwdPasses::kAll);

// ---- bf16 backward on Hopper's asynchronous path (TMA, mbarriers, wgmma; sm_90 devices) --------
// Same head dims, shapes and fallbacks as attention_fwd_bf16_sm90 (returns false, launching
// nothing, when it cannot run; callers then run attention_bwd_bf16). `workspace` holds
// attention_bwd_bf16_sm90_workspace_bytes(s, variant) bytes: delta (as attention_bwd_bf16's) first,
// then for the atomic-dQ variant an fp32 dQ accumulator. Variant 0 (the default) is deterministic
// (a dK/dV kernel per key tile and a dQ kernel per query tile, no atomics) and needs only delta;
// the other variant adds dQ with fp32 atomics (faster, not bitwise repeatable). `passes` as above
// (the atomic variant's dK/dV kernel also makes dQ, so kDkdv and kDq both run all of it).
bool attention_bwd_bf16_sm90(const AttnShape& s, const void* q, const void* k, const void* v,
                             const void* out, const float* lse, const void* dout, void* dq,
                             void* dk, void* dv, float* workspace, cudaStream_t stream,
                             int variant = 0, AttnBwdPasses passes = AttnBwdPasses::kAll);
bool attention_bwd_bf16_sm90_supports(const AttnShape& s);
int attention_bwd_bf16_sm90_num_variants(int64_t dim_qk, int64_t dim_v);
const char* attention_bwd_bf16_sm90_variant_name(int64_t dim_qk, int64_t dim_v, int variant);
// Whether the variant repeats bitwise by construction (no atomic dQ).
bool attention_bwd_bf16_sm90_variant_deterministic(int64_t dim_qk, int64_t dim_v, int variant);
size_t attention_bwd_bf16_sm90_workspace_bytes(const AttnShape& s, int variant);

// ---- CUDA-core path: any head dims <= 256, exact softmax, never fast ----------------------------
// float32 / float64 (accumulating in the storage type), and bf16 storage with fp32 accumulation
// for head dims the tensor-core kernels lack (small debug models).
constexpr int64_t kAttentionSimpleMaxDim = 256;
template <typename T>
void attention_fwd_simple(const AttnShape& s, const T* q, const T* k, const T* v, T* out, T* lse,
                          cudaStream_t stream);
// `delta`: workspace of B*Hq*S elements of T.
template <typename T>
void attention_bwd_simple(const AttnShape& s, const T* q, const T* k, const T* v, const T* out,
                          const T* lse, const T* dout, T* dq, T* dk, T* dv, T* delta,
                          cudaStream_t stream);
void attention_fwd_simple_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                               void* out, float* lse, cudaStream_t stream);
void attention_bwd_simple_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                               const void* out, const float* lse, const void* dout, void* dq,
                               void* dk, void* dv, float* delta, cudaStream_t stream);

// ---- a vendor library's fused attention (cuDNN), when the build has one ------------------------
// ops/cuda/cudnn_attention.cpp registers itself at static-initialisation time (it is compiled only
// where CMake found cuDNN), so ops/cuda/attention.cpp chooses it at prepare time with no #ifdef.
// The workspace functions build (and cache) the plan for the shape and return the scratch its
// launcher needs; they throw when the library refuses the shape. The backward is deterministic.
struct AttentionLibrary {
  const char* name;
  size_t (*fwd_workspace)(const AttnShape& s);
  size_t (*bwd_workspace)(const AttnShape& s);
  void (*fwd)(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
              float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream);
  void (*bwd)(const AttnShape& s, const void* q, const void* k, const void* v, const void* out,
              const float* lse, const void* dout, void* dq, void* dk, void* dv, void* workspace,
              size_t workspace_bytes, cudaStream_t stream);
};
void register_attention_library(const AttentionLibrary* library);
const AttentionLibrary* attention_library();  // nullptr when the build has none

}  // namespace meshtrain::cuda
