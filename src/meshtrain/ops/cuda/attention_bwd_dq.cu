// bf16 attention backward, dQ pass, plus the delta pre-pass and the public backward launcher.
// dQ is computed by its own kernel, one CTA per (batch, q head, block of BM queries) walking the
// key tiles it sees (like the forward): it recomputes S and dP instead of accumulating dQ across
// key-block CTAs with fp32 atomics, so dQ is deterministic at the price of two extra products
// (7 GEMM-equivalents per backward instead of FA2's 5).
#include <cmath>

#include "meshtrain/ops/cuda/attention_bwd.cuh"

namespace meshtrain::cuda {
namespace attn {
namespace {

// One warp per (batch, row, head): D = sum_d dout * out in fp32, from 16-byte loads.
__global__ void delta_kernel(const bf16* out, const bf16* dout, float* delta, int seq, int heads,
                             int dim, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const bf16* o = out + row * dim;
  const bf16* d = dout + row * dim;
  float sum = 0.f;
  for (int c = lane * 8; c < dim; c += 32 * 8) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
    const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 of = __bfloat1622float2(o2[j]), df = __bfloat1622float2(d2[j]);
      sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    const int64_t h = row % heads, i = (row / heads) % seq, b = row / (int64_t(heads) * seq);
    delta[(b * heads + h) * seq + i] = sum;
  }
}

template <int DQK, int DV, int BM, int BN>
struct DqConfig {
  static constexpr int kWarps = BM / 16, kThreads = kWarps * 32;
  static constexpr int kQ = 0, kDO = kQ + BM * DQK, kK = kDO + BM * DV, kV = kK + 2 * BN * DQK;
  static constexpr size_t kSmem = size_t(kV + 2 * BN * DV) * sizeof(bf16);
  static_assert(BN % 16 == 0 && DQK % 64 == 0 && DV % 64 == 0, "tile shape");
};

template <int DQK, int DV, int BM, int BN>
__global__ void __launch_bounds__(BM * 2, 1) dq_kernel(const BwdParams p, int num_m_blocks) {
  using Cfg = DqConfig<DQK, DV, BM, BN>;
  constexpr int kThreads = Cfg::kThreads, NT = BN / 8, QT = DQK / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sm = reinterpret_cast<bf16*>(smem_raw);
  bf16* sQ = sm + Cfg::kQ;
  bf16* sdO = sm + Cfg::kDO;
  bf16* sK = sm + Cfg::kK;  // two stages
  bf16* sV = sm + Cfg::kV;  // two stages

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.heads_q, h = blockIdx.x % p.heads_q, g = h / p.group;
  const int m0 = (num_m_blocks - 1 - int(blockIdx.y)) * BM;  // heaviest causal blocks first
  const int S = p.seq;
  const int64_t ldq = int64_t(p.heads_q) * DQK, ldk = int64_t(p.heads_kv) * DQK;
  const int64_t ldv = int64_t(p.heads_kv) * DV, ldo = int64_t(p.heads_q) * DV;
  const bf16* k = p.k + int64_t(b) * S * ldk + int64_t(g) * DQK;
  const bf16* v = p.v + int64_t(b) * S * ldv + int64_t(g) * DV;

  load_tile<BM, DQK, kThreads>(sQ, p.q + (int64_t(b) * S + m0) * ldq + int64_t(h) * DQK, ldq,
                               S - m0, tid);
  load_tile<BM, DV, kThreads>(sdO, p.dout + (int64_t(b) * S + m0) * ldo + int64_t(h) * DV, ldo,
                              S - m0, tid);
  cp_async_commit();
  auto load_kv = [&](int jt, int stage) {
    load_kv_tiles<BN, DQK, DV, kThreads>(sK + stage * BN * DQK, sV + stage * BN * DV, k, v, ldk,
                                         ldv, jt * BN, S, tid);
  };
  load_kv(0, 0);
  cp_async_commit();

  // This lane's two rows; rows past the end use lse = delta = 0 and are never stored.
  const int r_lo = 16 * warp + (lane >> 2);
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + r_lo + 8 * r;
    const int64_t at = (int64_t(b) * p.heads_q + h) * S + row;
    lse2[r] = row < S ? p.lse[at] * 1.4426950408889634f : 0.f;
    dlt[r] = row < S ? p.delta[at] : 0.f;
  }

  float acc[QT][4];
#pragma unroll
  for (int j = 0; j < QT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  const uint32_t q_a = base_a<DQK>(lane), do_a = base_a<DV>(lane);
  const uint32_t k_b = base_b<DQK>(lane), v_b = base_b<DV>(lane);
  const uint32_t k_bt = base_b_trans<DQK>(lane);
  const uint32_t sq = smem_addr(sQ), sdo = smem_addr(sdO);

  const int kv_end = p.causal ? min(S, m0 + BM) : S;
  const int n_tiles = (kv_end + BN - 1) / BN;
  for (int jt = 0; jt < n_tiles; ++jt) {
    const int st = pipeline_next_stage(jt, n_tiles, load_kv), n0 = jt * BN;
    const uint32_t sk = smem_addr(sK + st * BN * DQK), sv = smem_addr(sV + st * BN * DV);

    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, frag_addr<DQK>(sq, q_a, ks, 16 * warp));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, frag_addr<DQK>(sk, k_b, ks, 16 * np));
        mma16816(sc[2 * np], a, bb[0], bb[1]);
        mma16816(sc[2 * np + 1], a, bb[2], bb[3]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < DV / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, frag_addr<DV>(sdo, do_a, ks, 16 * warp));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, frag_addr<DV>(sv, v_b, ks, 16 * np));
        mma16816(dp[2 * np], a, bb[0], bb[1]);
        mma16816(dp[2 * np + 1], a, bb[2], bb[3]);
      }
    }

    const bool need_mask = n0 + BN > S || (p.causal && n0 + BN - 1 > m0);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pe = fast_exp2(fmaf(sc[j][e], p.scale_log2, -lse2[e >> 1]));
        if (need_mask) {
          const int key = n0 + 8 * j + 2 * (lane & 3) + (e & 1);
          const int query = m0 + r_lo + 8 * (e >> 1);
          if (key >= S || (p.causal && key > query)) pe = 0.f;
        }
        dp[j][e] = pe * (dp[j][e] - dlt[e >> 1]);  // dS
      }

      // dQ += dS K with dS (bf16) straight from registers.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      acc_to_a(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dpair = 0; dpair < DQK / 16; ++dpair) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, frag_addr<DQK>(sk, k_bt, dpair, 16 * kk));
        mma16816(acc[2 * dpair], a, bb[0], bb[1]);
        mma16816(acc[2 * dpair + 1], a, bb[2], bb[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int j = 0; j < QT; ++j) store_acc<DQK>(sQ, acc[j], 16 * warp, 8 * j, lane, p.scale, p.scale);
  __syncthreads();
  store_tile<BM, DQK, kThreads>(p.dq + (int64_t(b) * S + m0) * ldq + int64_t(h) * DQK, ldq, sQ,
                                S - m0, tid);
}

template <int DQK, int DV, int BM, int BN>
void launch(const AttnShape& s, const BwdParams& p, cudaStream_t stream) {
  using Cfg = DqConfig<DQK, DV, BM, BN>;
  constexpr auto kernel = dq_kernel<DQK, DV, BM, BN>;
  set_smem_limit_once<kernel>(Cfg::kSmem);
  const int num_m_blocks = int((s.seq + BM - 1) / BM);
  const dim3 grid(unsigned(s.batch * s.heads_q), unsigned(num_m_blocks));
  if (grid.x == 0 || grid.y == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(p, num_m_blocks);
  CUDA_CHECK_LAUNCH("attention_bwd_dq_bf16");
}

}  // namespace

BwdParams make_bwd_params(const AttnShape& s, const void* q, const void* k, const void* v,
                          const float* lse, const void* dout, void* dq, void* dk, void* dv,
                          const float* delta) {
  BwdParams p;
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.dout = static_cast<const bf16*>(dout);
  p.lse = lse;
  p.delta = delta;
  p.dq = static_cast<bf16*>(dq);
  p.dk = static_cast<bf16*>(dk);
  p.dv = static_cast<bf16*>(dv);
  p.seq = int(s.seq);
  p.heads_q = int(s.heads_q);
  p.heads_kv = int(s.heads_kv);
  p.group = int(s.heads_q / s.heads_kv);
  p.scale = float(s.scale);
  p.scale_log2 = float(s.scale * M_LOG2E);
  p.causal = s.causal;
  return p;
}

bool launch_bwd_dq(const AttnShape& s, const BwdParams& p, cudaStream_t stream) {
  if (s.dim_qk == 192 && s.dim_v == 128)
    launch<192, 128, 128, 64>(s, p, stream);
  else if (s.dim_qk == 128 && s.dim_v == 128)
    launch<128, 128, 128, 64>(s, p, stream);
  else if (s.dim_qk == 64 && s.dim_v == 64)
    launch<64, 64, 128, 64>(s, p, stream);
  else
    return false;
  return true;
}

}  // namespace attn

bool attention_bwd_bf16(const AttnShape& s, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, const void* dout, void* dq, void* dk,
                        void* dv, float* delta, cudaStream_t stream, AttnBwdPasses passes) {
  using namespace attn;
  const bool known = (s.dim_qk == 192 && s.dim_v == 128) || (s.dim_qk == 128 && s.dim_v == 128) ||
                     (s.dim_qk == 64 && s.dim_v == 64);
  if (!known) return false;
  const int64_t rows = s.batch * s.seq * s.heads_q;
  const bool all = passes == AttnBwdPasses::kAll;
  if (rows > 0 && (all || passes == AttnBwdPasses::kDelta)) {
    delta_kernel<<<unsigned((rows + 7) / 8), 256, 0, stream>>>(
        static_cast<const bf16*>(out), static_cast<const bf16*>(dout), delta, int(s.seq),
        int(s.heads_q), int(s.dim_v), rows);
    CUDA_CHECK_LAUNCH("attention_bwd_delta_bf16");
  }
  const BwdParams p = make_bwd_params(s, q, k, v, lse, dout, dq, dk, dv, delta);
  // The two passes are independent given delta; on one stream they simply run back to back.
  if (all || passes == AttnBwdPasses::kDkdv) launch_bwd_dkdv(s, p, stream);
  if (rows > 0 && (all || passes == AttnBwdPasses::kDq)) launch_bwd_dq(s, p, stream);
  return true;
}

}  // namespace meshtrain::cuda
