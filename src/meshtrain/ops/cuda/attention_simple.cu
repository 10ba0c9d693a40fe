// Attention on CUDA cores: one warp per query row (forward, dQ) or per key row (dK/dV), lanes
// across the head dims, exact exp/log, accumulation in A (fp32; fp64 for fp64 storage). Correct
// for any head dims <= 256 and never fast: it serves float32/float64 (so fp32 CUDA-vs-CPU parity
// runs use the CUDA backend end to end) and bf16 head dims without a tensor-core kernel.
// Deterministic: every output element is summed by one warp in key (or query) order.
#include <cuda_bf16.h>

#include <cfloat>

#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {
namespace {

constexpr int kChunks = int(kAttentionSimpleMaxDim / 32);  // head-dim values per lane
constexpr int kWarpsPerBlock = 4;

struct SimpleArgs {
  int64_t rows;  // warps to run
  int seq, heads_q, heads_kv, group, dim_qk, dim_v;
  double scale;
  bool causal;
};

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
// Storage T -> accumulation A and back (bf16 rounds to nearest even).
template <typename A, typename T>
__device__ __forceinline__ A ld(const T& x) {
  return A(x);
}
template <>
__device__ __forceinline__ float ld<float, __nv_bfloat16>(const __nv_bfloat16& x) {
  return __bfloat162float(x);
}
template <typename T, typename A>
__device__ __forceinline__ T st(A x) {
  return T(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16, float>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }

// Lane's slice of a head vector: element lane + 32 c for c < kChunks (0 past the end).
template <typename A, typename T>
__device__ __forceinline__ void load_row(A (&r)[kChunks], const T* p, int dim, int lane) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) r[c] = lane + 32 * c < dim ? ld<A>(p[lane + 32 * c]) : A(0);
}
template <typename A, typename T>
__device__ __forceinline__ A dot_row(const A (&r)[kChunks], const T* p, int dim, int lane) {
  A acc = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    if (lane + 32 * c < dim) acc += r[c] * ld<A>(p[lane + 32 * c]);
  return warp_sum(acc);
}

// Row index r = (b * S + i) * Hq + h: q, out and dout rows are contiguous in that order.
template <typename T, typename A>
__global__ void fwd_kernel(const T* q, const T* k, const T* v, T* out, A* lse, SimpleArgs a) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.rows) return;
  const int h = int(row % a.heads_q), i = int((row / a.heads_q) % a.seq);
  const int64_t b = row / (int64_t(a.heads_q) * a.seq);
  const int g = h / a.group;
  A qv[kChunks], acc[kChunks];
  load_row(qv, q + row * a.dim_qk, a.dim_qk, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0;
  A m = -INFINITY, l = 0;
  const int n = a.causal ? i + 1 : a.seq;
  for (int j = 0; j < n; ++j) {
    const int64_t kv = (b * a.seq + j) * a.heads_kv + g;
    const A s = dot_row(qv, k + kv * a.dim_qk, a.dim_qk, lane) * A(a.scale);
    const A m_new = s > m ? s : m;
    const A alpha = exp_t(m - m_new), p = exp_t(s - m_new);  // alpha = 0 on the first key
    l = l * alpha + p;
    const T* vr = v + kv * a.dim_v;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      if (lane + 32 * c < a.dim_v) acc[c] = acc[c] * alpha + p * ld<A>(vr[lane + 32 * c]);
    m = m_new;
  }
  const A inv = A(1) / l;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    if (lane + 32 * c < a.dim_v) out[row * a.dim_v + lane + 32 * c] = st<T>(acc[c] * inv);
  if (lane == 0) lse[(b * a.heads_q + h) * a.seq + i] = m + log_t(l);
}

template <typename T, typename A>
__global__ void delta_kernel(const T* out, const T* dout, A* delta, SimpleArgs a) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.rows) return;
  A o[kChunks];
  load_row(o, out + row * a.dim_v, a.dim_v, lane);
  const A d = dot_row(o, dout + row * a.dim_v, a.dim_v, lane);
  const int h = int(row % a.heads_q), i = int((row / a.heads_q) % a.seq);
  const int64_t b = row / (int64_t(a.heads_q) * a.seq);
  if (lane == 0) delta[(b * a.heads_q + h) * a.seq + i] = d;
}

// dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j, one warp per query row.
template <typename T, typename A>
__global__ void dq_kernel(const T* q, const T* k, const T* v, const A* lse, const T* dout,
                          const A* delta, T* dq, SimpleArgs a) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.rows) return;
  const int h = int(row % a.heads_q), i = int((row / a.heads_q) % a.seq);
  const int64_t b = row / (int64_t(a.heads_q) * a.seq);
  const int g = h / a.group;
  A qv[kChunks], dov[kChunks], acc[kChunks];
  load_row(qv, q + row * a.dim_qk, a.dim_qk, lane);
  load_row(dov, dout + row * a.dim_v, a.dim_v, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0;
  const int64_t stat = (b * a.heads_q + h) * a.seq + i;
  const A l = lse[stat], dl = delta[stat];
  const int n = a.causal ? i + 1 : a.seq;
  for (int j = 0; j < n; ++j) {
    const int64_t kv = (b * a.seq + j) * a.heads_kv + g;
    const T* kr = k + kv * a.dim_qk;
    const A p = exp_t(dot_row(qv, kr, a.dim_qk, lane) * A(a.scale) - l);
    const A ds = p * (dot_row(dov, v + kv * a.dim_v, a.dim_v, lane) - dl);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      if (lane + 32 * c < a.dim_qk) acc[c] += ds * ld<A>(kr[lane + 32 * c]);
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    if (lane + 32 * c < a.dim_qk) dq[row * a.dim_qk + lane + 32 * c] = st<T>(acc[c] * A(a.scale));
}

// dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij q_i over the q heads of kv head g, one
// warp per key row; row index r = (b * S + j) * Hkv + g.
template <typename T, typename A>
__global__ void dkdv_kernel(const T* q, const T* k, const T* v, const A* lse, const T* dout,
                            const A* delta, T* dk, T* dv, SimpleArgs a) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.rows) return;
  const int g = int(row % a.heads_kv), j = int((row / a.heads_kv) % a.seq);
  const int64_t b = row / (int64_t(a.heads_kv) * a.seq);
  A kv[kChunks], vv[kChunks], acc_k[kChunks], acc_v[kChunks];
  load_row(kv, k + row * a.dim_qk, a.dim_qk, lane);
  load_row(vv, v + row * a.dim_v, a.dim_v, lane);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc_k[c] = acc_v[c] = 0;
  for (int hh = g * a.group; hh < (g + 1) * a.group; ++hh)
    for (int i = a.causal ? j : 0; i < a.seq; ++i) {
      const int64_t qrow = (b * a.seq + i) * a.heads_q + hh;
      const int64_t stat = (b * a.heads_q + hh) * a.seq + i;
      const T* qr = q + qrow * a.dim_qk;
      const T* dor = dout + qrow * a.dim_v;
      const A p = exp_t(dot_row(kv, qr, a.dim_qk, lane) * A(a.scale) - lse[stat]);
      const A ds = p * (dot_row(vv, dor, a.dim_v, lane) - delta[stat]);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (lane + 32 * c < a.dim_v) acc_v[c] += p * ld<A>(dor[lane + 32 * c]);
        if (lane + 32 * c < a.dim_qk) acc_k[c] += ds * ld<A>(qr[lane + 32 * c]);
      }
    }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (lane + 32 * c < a.dim_qk) dk[row * a.dim_qk + lane + 32 * c] = st<T>(acc_k[c] * A(a.scale));
    if (lane + 32 * c < a.dim_v) dv[row * a.dim_v + lane + 32 * c] = st<T>(acc_v[c]);
  }
}

SimpleArgs make_args(const AttnShape& s, int64_t rows) {
  return {rows,          int(s.seq),   int(s.heads_q), int(s.heads_kv), int(s.heads_q / s.heads_kv),
          int(s.dim_qk), int(s.dim_v), s.scale,        s.causal};
}
unsigned blocks_for(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename T, typename A>
void fwd(const AttnShape& s, const T* q, const T* k, const T* v, T* out, A* lse,
         cudaStream_t stream) {
  const SimpleArgs a = make_args(s, s.batch * s.seq * s.heads_q);
  if (a.rows == 0) return;
  fwd_kernel<T, A><<<blocks_for(a.rows), 32 * kWarpsPerBlock, 0, stream>>>(q, k, v, out, lse, a);
  CUDA_CHECK_LAUNCH("attention_fwd_simple");
}

template <typename T, typename A>
void bwd(const AttnShape& s, const T* q, const T* k, const T* v, const T* out, const A* lse,
         const T* dout, T* dq, T* dk, T* dv, A* delta, cudaStream_t stream) {
  const SimpleArgs aq = make_args(s, s.batch * s.seq * s.heads_q);
  const SimpleArgs akv = make_args(s, s.batch * s.seq * s.heads_kv);
  const unsigned threads = 32 * kWarpsPerBlock;
  if (aq.rows > 0) {
    delta_kernel<T, A><<<blocks_for(aq.rows), threads, 0, stream>>>(out, dout, delta, aq);
    CUDA_CHECK_LAUNCH("attention_bwd_delta_simple");
    dq_kernel<T, A><<<blocks_for(aq.rows), threads, 0, stream>>>(q, k, v, lse, dout, delta, dq, aq);
    CUDA_CHECK_LAUNCH("attention_bwd_dq_simple");
  }
  if (akv.rows > 0) {  // with no q heads this writes dk = dv = 0
    dkdv_kernel<T, A>
        <<<blocks_for(akv.rows), threads, 0, stream>>>(q, k, v, lse, dout, delta, dk, dv, akv);
    CUDA_CHECK_LAUNCH("attention_bwd_dkdv_simple");
  }
}

}  // namespace

template <typename T>
void attention_fwd_simple(const AttnShape& s, const T* q, const T* k, const T* v, T* out, T* lse,
                          cudaStream_t stream) {
  fwd<T, T>(s, q, k, v, out, lse, stream);
}

template <typename T>
void attention_bwd_simple(const AttnShape& s, const T* q, const T* k, const T* v, const T* out,
                          const T* lse, const T* dout, T* dq, T* dk, T* dv, T* delta,
                          cudaStream_t stream) {
  bwd<T, T>(s, q, k, v, out, lse, dout, dq, dk, dv, delta, stream);
}

void attention_fwd_simple_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                               void* out, float* lse, cudaStream_t stream) {
  using B = __nv_bfloat16;
  fwd<B, float>(s, static_cast<const B*>(q), static_cast<const B*>(k), static_cast<const B*>(v),
                static_cast<B*>(out), lse, stream);
}

void attention_bwd_simple_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                               const void* out, const float* lse, const void* dout, void* dq,
                               void* dk, void* dv, float* delta, cudaStream_t stream) {
  using B = __nv_bfloat16;
  bwd<B, float>(s, static_cast<const B*>(q), static_cast<const B*>(k), static_cast<const B*>(v),
                static_cast<const B*>(out), lse, static_cast<const B*>(dout), static_cast<B*>(dq),
                static_cast<B*>(dk), static_cast<B*>(dv), delta, stream);
}

template void attention_fwd_simple<float>(const AttnShape&, const float*, const float*,
                                          const float*, float*, float*, cudaStream_t);
template void attention_fwd_simple<double>(const AttnShape&, const double*, const double*,
                                           const double*, double*, double*, cudaStream_t);
template void attention_bwd_simple<float>(const AttnShape&, const float*, const float*,
                                          const float*, const float*, const float*, const float*,
                                          float*, float*, float*, float*, cudaStream_t);
template void attention_bwd_simple<double>(const AttnShape&, const double*, const double*,
                                           const double*, const double*, const double*,
                                           const double*, double*, double*, double*, double*,
                                           cudaStream_t);

}  // namespace meshtrain::cuda
