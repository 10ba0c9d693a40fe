// Internal to the bf16 attention backward: the parameter block its kernels share and the launchers
// of its three passes (delta, dK/dV per key block, dQ per query block), split over .cu files so
// they compile in parallel.
#pragma once

#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/attention_mma.cuh"

namespace meshtrain::cuda::attn {

struct BwdParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* dout;
  const float* lse;    // [B, Hq, S], natural log
  const float* delta;  // [B, Hq, S], rowsum(dout * out)
  bf16* dq;
  bf16* dk;
  bf16* dv;
  int seq, heads_q, heads_kv, group;
  float scale, scale_log2;
  bool causal;
};

BwdParams make_bwd_params(const AttnShape& s, const void* q, const void* k, const void* v,
                          const float* lse, const void* dout, void* dq, void* dk, void* dv,
                          const float* delta);

// Each returns false for head dims without a compiled kernel (launching nothing).
bool launch_bwd_dkdv(const AttnShape& s, const BwdParams& p, cudaStream_t stream);
bool launch_bwd_dq(const AttnShape& s, const BwdParams& p, cudaStream_t stream);

}  // namespace meshtrain::cuda::attn
