// bf16 attention backward, dK/dV pass: one CTA per (batch, kv head, block of BN keys) keeps K and
// V in smem and walks every (q head of its GQA group, query block) that sees those keys, with a
// two-stage cp.async pipeline for Q, dO, lse and delta. P and dS go through smem so the two
// accumulating products (dV += P^T dO, dK += dS^T Q) can use a different warp split than the
// score products. Each dK/dV element is owned by one thread and summed in a fixed order.
#include "meshtrain/ops/cuda/attention_bwd.cuh"

namespace meshtrain::cuda::attn {
namespace {

template <int DQK, int DV, int BM, int BN>
struct DkdvConfig {
  static constexpr int kWarps = 8, kThreads = kWarps * 32;
  // Tiles, in elements: K, V, then two stages of Q and dO, then P and dS ([BM][BN] each).
  static constexpr int kK = 0, kV = kK + BN * DQK, kQ = kV + BN * DV;
  static constexpr int kDO = kQ + 2 * BM * DQK, kP = kDO + 2 * BM * DV, kDS = kP + BM * BN;
  static constexpr int kEnd = kDS + BM * BN;
  // Then two stages of lse and delta (fp32, BM each).
  static constexpr size_t kSmem = size_t(kEnd) * sizeof(bf16) + 4 * BM * sizeof(float);
  static_assert(BM == 64 && BN == 64, "the warp splits below assume 64 x 64 score tiles");
  static_assert(DQK % 64 == 0 && DV % 64 == 0 && DV <= DQK, "dK/dV staging reuses Q's smem");
  static_assert(2 * BM <= kThreads, "one thread per lse and delta element");
};

template <int DQK, int DV, int BM, int BN>
__global__ void __launch_bounds__(256, 1) dkdv_kernel(const BwdParams p) {
  using Cfg = DkdvConfig<DQK, DV, BM, BN>;
  constexpr int kThreads = Cfg::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sm = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sm + Cfg::kK;
  bf16* sV = sm + Cfg::kV;
  bf16* sQ = sm + Cfg::kQ;
  bf16* sdO = sm + Cfg::kDO;
  bf16* sP = sm + Cfg::kP;
  bf16* sdS = sm + Cfg::kDS;
  float* sL = reinterpret_cast<float*>(sm + Cfg::kEnd);  // [2][BM] lse (natural log)
  float* sD = sL + 2 * BM;                               // [2][BM] delta

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.heads_kv, g = blockIdx.x % p.heads_kv;
  const int n0 = int(blockIdx.y) * BN;
  const int S = p.seq;
  const int64_t ldq = int64_t(p.heads_q) * DQK, ldk = int64_t(p.heads_kv) * DQK;
  const int64_t ldv = int64_t(p.heads_kv) * DV, ldo = int64_t(p.heads_q) * DV;

  load_tile<BN, DQK, kThreads>(sK, p.k + (int64_t(b) * S + n0) * ldk + int64_t(g) * DQK, ldk,
                               S - n0, tid);
  load_tile<BN, DV, kThreads>(sV, p.v + (int64_t(b) * S + n0) * ldv + int64_t(g) * DV, ldv, S - n0,
                              tid);
  cp_async_commit();

  // Causal: query blocks before the one holding key n0 see none of these keys.
  const int num_m_blocks = (S + BM - 1) / BM;
  const int i_start = p.causal ? n0 / BM : 0;
  const int nq = num_m_blocks - i_start;
  const int total = p.group * nq;

  auto prefetch = [&](int t, int stage) {
    const int hh = g * p.group + t / nq, m0 = (i_start + t % nq) * BM;
    load_tile<BM, DQK, kThreads>(sQ + stage * BM * DQK,
                                 p.q + (int64_t(b) * S + m0) * ldq + int64_t(hh) * DQK, ldq, S - m0,
                                 tid);
    load_tile<BM, DV, kThreads>(sdO + stage * BM * DV,
                                p.dout + (int64_t(b) * S + m0) * ldo + int64_t(hh) * DV, ldo,
                                S - m0, tid);
    // Rows past the end read as lse = delta = 0; their Q and dO rows are zero, so P * dO and
    // dS = P (dP - delta) vanish there and they add nothing to dK or dV.
    const int64_t row0 = (int64_t(b) * p.heads_q + hh) * S + m0;
    const int r = tid < BM ? tid : tid - BM;
    const bool valid = m0 + r < S;
    if (tid < 2 * BM)
      cp_async4((tid < BM ? sL : sD) + stage * BM + r,
                (tid < BM ? p.lse : p.delta) + row0 + (valid ? r : 0), valid);
  };
  if (total > 0) prefetch(0, 0);
  cp_async_commit();

  // Score products: warp (wm, wn) owns queries [16 wm, +16) x keys [32 wn, +32).
  const int wm = warp & 3, wn = warp >> 2;
  // Accumulating products: warp (wk, wd) owns keys [32 wk, +32) x a quarter of the head dims.
  const int wk = warp & 1, wd = warp >> 1;
  constexpr int NV = DV / 32, NK = DQK / 32;  // n8 tiles per warp
  float acc_dv[2][NV][4], acc_dk[2][NK][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NV; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[mt][j][e] = 0.f;
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][j][e] = 0.f;
  }
  const uint32_t q_a = base_a<DQK>(lane), do_a = base_a<DV>(lane);
  const uint32_t k_b = base_b<DQK>(lane), v_b = base_b<DV>(lane);
  const uint32_t p_at = base_a_trans<BN>(lane);
  const uint32_t do_bt = base_b_trans<DV>(lane), q_bt = base_b_trans<DQK>(lane);
  const uint32_t sk = smem_addr(sK), sv = smem_addr(sV), sp = smem_addr(sP), sds = smem_addr(sdS);

  for (int t = 0; t < total; ++t) {
    const int st = pipeline_next_stage(t, total, prefetch);
    const int m0 = (i_start + t % nq) * BM;
    const uint32_t sq = smem_addr(sQ + st * BM * DQK), sdo = smem_addr(sdO + st * BM * DV);

    // S = Q K^T and dP = dO V^T on this warp's 16 x 32 block.
    float sc[4][4], dp[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, frag_addr<DQK>(sq, q_a, ks, 16 * wm));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, frag_addr<DQK>(sk, k_b, ks, 32 * wn + 16 * np));
        mma16816(sc[2 * np], a, bb[0], bb[1]);
        mma16816(sc[2 * np + 1], a, bb[2], bb[3]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < DV / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, frag_addr<DV>(sdo, do_a, ks, 16 * wm));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, frag_addr<DV>(sv, v_b, ks, 32 * wn + 16 * np));
        mma16816(dp[2 * np], a, bb[0], bb[1]);
        mma16816(dp[2 * np + 1], a, bb[2], bb[3]);
      }
    }

    // P = exp(scale S - lse) (0 where masked), dS = P (dP - delta); both to smem as bf16.
    const int r_lo = 16 * wm + (lane >> 2);
    float lse2[2], dlt[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse2[r] = sL[st * BM + r_lo + 8 * r] * 1.4426950408889634f;
      dlt[r] = sD[st * BM + r_lo + 8 * r];
    }
    const bool need_mask = n0 + BN > S || (p.causal && n0 + BN - 1 > m0);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pe = fast_exp2(fmaf(sc[j][e], p.scale_log2, -lse2[e >> 1]));
        if (need_mask) {
          const int key = n0 + 32 * wn + 8 * j + 2 * (lane & 3) + (e & 1);
          const int query = m0 + r_lo + 8 * (e >> 1);
          if (key >= S || (p.causal && key > query)) pe = 0.f;
        }
        sc[j][e] = pe;
        dp[j][e] = pe * (dp[j][e] - dlt[e >> 1]);
      }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      store_acc<BN>(sP, sc[j], 16 * wm, 32 * wn + 8 * j, lane, 1.f, 1.f);
      store_acc<BN>(sdS, dp[j], 16 * wm, 32 * wn + 8 * j, lane, 1.f, 1.f);
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q over this block's BM queries.
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4_trans(a[mt], frag_addr<BN>(sp, p_at, 2 * wk + mt, 16 * kq));
#pragma unroll
      for (int np = 0; np < NV / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, frag_addr<DV>(sdo, do_bt, wd * (DV / 64) + np, 16 * kq));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma16816(acc_dv[mt][2 * np], a[mt], bb[0], bb[1]);
          mma16816(acc_dv[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4_trans(a[mt], frag_addr<BN>(sds, p_at, 2 * wk + mt, 16 * kq));
#pragma unroll
      for (int np = 0; np < NK / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, frag_addr<DQK>(sq, q_bt, wd * (DQK / 64) + np, 16 * kq));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma16816(acc_dk[mt][2 * np], a[mt], bb[0], bb[1]);
          mma16816(acc_dk[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
    __syncthreads();  // P, dS and this stage are free for the next iteration
  }

  cp_async_wait<0>();  // only matters when there was no iteration (no q heads)
  __syncthreads();

  // dK (times the softmax scale) and dV through Q's smem (free after the last barrier).
  bf16* sdK = sQ;             // [BN][DQK]
  bf16* sdV = sQ + BN * DQK;  // [BN][DV]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NK; ++j)
      store_acc<DQK>(sdK, acc_dk[mt][j], 32 * wk + 16 * mt, wd * (DQK / 4) + 8 * j, lane, p.scale,
                     p.scale);
#pragma unroll
    for (int j = 0; j < NV; ++j)
      store_acc<DV>(sdV, acc_dv[mt][j], 32 * wk + 16 * mt, wd * (DV / 4) + 8 * j, lane, 1.f, 1.f);
  }
  __syncthreads();
  store_tile<BN, DQK, kThreads>(p.dk + (int64_t(b) * S + n0) * ldk + int64_t(g) * DQK, ldk, sdK,
                                S - n0, tid);
  store_tile<BN, DV, kThreads>(p.dv + (int64_t(b) * S + n0) * ldv + int64_t(g) * DV, ldv, sdV,
                               S - n0, tid);
}

template <int DQK, int DV>
void launch(const AttnShape& s, const BwdParams& p, cudaStream_t stream) {
  constexpr int BM = 64, BN = 64;
  using Cfg = DkdvConfig<DQK, DV, BM, BN>;
  constexpr auto kernel = dkdv_kernel<DQK, DV, BM, BN>;
  set_smem_limit_once<kernel>(Cfg::kSmem);
  const dim3 grid(unsigned(s.batch * s.heads_kv), unsigned((s.seq + BN - 1) / BN));
  if (grid.x == 0 || grid.y == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH("attention_bwd_dkdv_bf16");
}

}  // namespace

bool launch_bwd_dkdv(const AttnShape& s, const BwdParams& p, cudaStream_t stream) {
  if (s.dim_qk == 192 && s.dim_v == 128)
    launch<192, 128>(s, p, stream);
  else if (s.dim_qk == 128 && s.dim_v == 128)
    launch<128, 128>(s, p, stream);
  else if (s.dim_qk == 64 && s.dim_v == 64)
    launch<64, 64>(s, p, stream);
  else
    return false;
  return true;
}

}  // namespace meshtrain::cuda::attn
