// bf16 flash-attention backward on Hopper's asynchronous path (FlashAttention-2/3's backward,
// written from the papers): delta = rowsum(dO ∘ O) (the mma.sync path's pass), then a dK/dV kernel
// per key tile and either a dQ kernel per query tile (deterministic, the default) or fp32 atomic
// dQ adds from the dK/dV kernel (variant 1). TMA loads on mbarriers, wgmma for every product.
#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/cuda/attention_bwd_sm90.cuh"
#include "meshtrain/ops/cuda/cuda_workspace.h"

namespace meshtrain::cuda {
namespace sm90bwd {

// ---- dK/dV (and the atomic dQ) ----------------------------------------------------------------
// Each consumer warpgroup computes the transposed products Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (M = its 64
// keys, N = 64 queries), so Pᵀ and dSᵀ come out in the accumulator layout that is already the
// register A operand of dV += Pᵀ dO and dK += dSᵀ Q (Q and dO as MN-major B): nothing is
// transposed through shared memory. lse and delta belong to the columns (queries).
template <int DQK, int DV, bool kAtomicDq, bool kWideRegs>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_sm90_kernel(const __grid_constant__ BwdParams p) {
  using C = DkdvConfig<DQK, DV>;
  constexpr int BM = C::kBM, BN = C::kBN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base + C::kKOff, sV = base + C::kVOff, sQ = base + C::kQOff;
  const uint32_t sDO = base + C::kDOOff, sDS = base + C::kDSOff;
  float* sLse = reinterpret_cast<float*>(smem_raw + (base + C::kLseOff - smem_u32(smem_raw)));
  float* sDelta = sLse + C::kStages * BM;
  const uint32_t bar = base + C::kBarOff;
  auto kv_full = [&] { return bar; };
  auto full = [&](int s) { return bar + 8 + 8 * s; };
  auto empty = [&](int s) { return bar + 24 + 8 * s; };

  const int b = int(blockIdx.x) / p.heads_kv, g = int(blockIdx.x) % p.heads_kv;
  const int n0 = int(blockIdx.y) * BN;  // causal: the lowest key tiles see the most queries
  const int S = p.seq;
  const int num_m_blocks = (S + BM - 1) / BM;
  const int i_start = p.causal ? n0 / BM : 0;  // earlier query tiles see none of these keys
  const int nq = num_m_blocks - i_start;
  const int total = p.group * nq;  // (q head of the group, query tile) pairs, head-major

  if (threadIdx.x == 0) {
    mbar_init(kv_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full(s), 1 + 32);  // the TMA thread's expect_tx + the lse/delta warp's lanes
      mbar_init(empty(s), kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    setmaxnreg_dec<DkdvRegs<kWideRegs>::kProducer>();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    if (threadIdx.x == 0) {
      // ---- TMA: K and V once, then Q and dO per (head, query tile) ----------------------------
      tma_prefetch_map(&p.tm_q);
      tma_prefetch_map(&p.tm_do);
      mbar_arrive_expect_tx(kv_full(), C::kKBytes + C::kVBytes);
#pragma unroll
      for (int c = 0; c < DQK / 64; ++c)
        tma_load_4d(&p.tm_k, sK + c * BN * 128, kv_full(), c * 64, g, n0, b);
#pragma unroll
      for (int c = 0; c < DV / 64; ++c)
        tma_load_4d(&p.tm_v, sV + c * BN * 128, kv_full(), c * 64, g, n0, b);
      for (int t = 0; t < total; ++t) {
        const int st = t & 1, hh = g * p.group + t / nq, m0 = (i_start + t % nq) * BM;
        mbar_wait(empty(st), ((t >> 1) & 1) ^ 1);
        mbar_arrive_expect_tx(full(st), C::kQBytes + C::kDOBytes);
#pragma unroll
        for (int c = 0; c < DQK / 64; ++c)
          tma_load_4d(&p.tm_q, sQ + st * C::kQBytes + c * BM * 128, full(st), c * 64, hh, m0, b);
#pragma unroll
        for (int c = 0; c < DV / 64; ++c)
          tma_load_4d(&p.tm_do, sDO + st * C::kDOBytes + c * BM * 128, full(st), c * 64, hh, m0, b);
      }
    } else if (warp == 1) {
      // ---- lse and delta rows of the same tiles (0 past the sequence; those rows are masked) --
      for (int t = 0; t < total; ++t) {
        const int st = t & 1, hh = g * p.group + t / nq, m0 = (i_start + t % nq) * BM;
        mbar_wait(empty(st), ((t >> 1) & 1) ^ 1);
        const int64_t row0 = (int64_t(b) * p.heads_q + hh) * S;
        for (int r = lane; r < BM; r += 32) {
          const bool valid = m0 + r < S;
          sLse[st * BM + r] = valid ? p.lse[row0 + m0 + r] : 0.f;
          sDelta[st * BM + r] = valid ? p.delta[row0 + m0 + r] : 0.f;
        }
        mbar_arrive(full(st));  // release: the stores above are visible to the waiting consumers
      }
    }
    return;
  }

  // ---- consumers --------------------------------------------------------------------------------
  setmaxnreg_inc<DkdvRegs<kWideRegs>::kConsumer>();
  const int w = wg - 1, t_in = int(threadIdx.x) - 128 * wg, lane = t_in & 31;
  const int row_in_wg = 16 * (t_in >> 5) + (lane >> 2);  // this thread's upper key row; +8 lower
  const int key_lo = n0 + 64 * w + row_in_wg;
  const uint32_t k_rows = sK + w * 64 * 128, v_rows = sV + w * 64 * 128;
  const bool causal = p.causal != 0;
  float dk[DQK / 2], dv[DV / 2];
#pragma unroll
  for (int i = 0; i < DQK / 2; ++i) dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) dv[i] = 0.f;

  mbar_wait(kv_full(), 0);
  int qh = 0, qi = 0;  // (head, query tile) of iteration t, without divisions
  for (int t = 0; t < total; ++t, qi = qi + 1 == nq ? 0 : qi + 1, qh += qi == 0) {
    const int st = t & 1, hh = g * p.group + qh, m0 = (i_start + qi) * BM;
    const uint32_t q_t = sQ + st * C::kQBytes, do_t = sDO + st * C::kDOBytes;
    mbar_wait(full(st), (t >> 1) & 1);

    // dK and dV hold (Dqk + Dv) / 2 accumulator registers (160 at 192/128), so S and dP are never
    // live together: dP is computed beside dV += Pᵀ dO, after P is packed to bf16, and dS uses
    // that bf16 P (the same rounding dS gets when it is packed for dK += dSᵀ Q).
    float s[32], dp[32];
    wgmma_fence();
    wgmma_n64_kmajor<DQK>(s, k_rows, BN * 128, q_t, BM * 128);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    // Pᵀ = exp(scale S - lse) (0 where masked), per query column.
    const bool need_mask = m0 + BM > S || n0 + 64 * w + 64 > S || (causal && m0 < n0 + 64 * w + 63);
    const float* lse_t = sLse + st * BM;
    const float* dl_t = sDelta + st * BM;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 8 * j + 2 * (lane & 3);
      const float2 l2 = *reinterpret_cast<const float2*>(lse_t + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse2 = ((e & 1) ? l2.y : l2.x) * kLog2e;
        float pe = attn::fast_exp2(fmaf(s[4 * j + e], p.scale_log2, -lse2));
        if (need_mask) {
          const int query = m0 + c + (e & 1), key = key_lo + 8 * (e >> 1);
          if (query >= S || key >= S || (causal && key > query)) pe = 0.f;
        }
        s[4 * j + e] = pe;
      }
    }
    uint32_t pr[16], dsr[16];
    acc_to_a_regs<64>(pr, s);

    // dV += Pᵀ dO and dPᵀ = V dOᵀ.
    wgmma_fence();
    fence_regs(dv);
    fence_regs(pr);
    wgmma_regs_mnmajor<DV, BM>(dv, pr, do_t, BM * 128);
    wgmma_n64_kmajor<DV>(dp, v_rows, BN * 128, do_t, BM * 128);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(pr);
    fence_regs(dp);

    // dSᵀ = Pᵀ ∘ (dPᵀ - delta).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 8 * j + 2 * (lane & 3);
      const float2 d2 = *reinterpret_cast<const float2*>(dl_t + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t pp = pr[2 * j + (e >> 1)];
        const float pe = __uint_as_float((e & 1) ? (pp & 0xffff0000u) : (pp << 16));
        dp[4 * j + e] = pe * (dp[4 * j + e] - ((e & 1) ? d2.y : d2.x));
      }
    }
    acc_to_a_regs<64>(dsr, dp);

    if constexpr (kAtomicDq) {
      // dSᵀ bf16 into rows 64w.. of this stage's [128 keys][64 queries] tile (the A operand of
      // dQ += dS K, MN-major). Its readers of two iterations ago are done: both warpgroups passed
      // the last iteration's barrier after their wait_group 0.
      const uint32_t ds_t = sDS + st * C::kDSBytes;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          asm volatile(
              "st.shared.u32 [%0], %1;\n" ::"r"(
                  ds_t + sw128_offset(BN, 64 * w + row_in_wg + 8 * r, 8 * j + 2 * (lane & 3))),
              "r"(dsr[2 * j + r])
              : "memory");
      fence_proxy_async_smem();
    }

    wgmma_fence();
    fence_regs(dk);
    fence_regs(dsr);
    wgmma_regs_mnmajor<DQK, BM>(dk, dsr, q_t, BM * 128);
    wgmma_commit();

    if constexpr (kAtomicDq) {
      named_bar_sync(1, 256);  // both warpgroups' halves of the dSᵀ tile are in place
      const uint64_t da = wgmma_desc_sw128(sDS + st * C::kDSBytes, C::kDSBytes, kSw128Sbo);
      float* dq_rows = p.dq_accum + (int64_t(b) * S + m0) * p.heads_q * DQK + int64_t(hh) * DQK;
      // The CTA's dQ partial over all 128 keys (one atomic add per element per key tile): warpgroup
      // w takes the 64-column chunks c = w, w + 2, ...
#pragma unroll 1
      for (int c = w; c < DQK / 64; c += 2) {
        // dQ[64 queries][64c..+63] = dS (M = queries, K = the 128 keys) K[keys][64c..].
        const uint64_t db = wgmma_desc_sw128(sK + c * BN * 128, BN * 128, kSw128Sbo);
        float acc[32];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks)
          wgmma_m64n64k16_ss<1, 1>(acc, da + ((ks * 2048) >> 4), db + ((ks * 2048) >> 4), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qr = row_in_wg + 8 * r;  // query row (the accumulator's M)
          if (m0 + qr >= S) continue;
          float* dst = dq_rows + int64_t(qr) * p.heads_q * DQK + 64 * c + 2 * (lane & 3);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            atomicAdd(reinterpret_cast<float2*>(dst + 8 * j),
                      make_float2(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]));
        }
      }
    }
    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dsr);
    if (lane == 0) mbar_arrive(empty(st));
  }

  // dK (times the softmax scale) and dV straight from the accumulators; rows past S are skipped.
  const int rows_valid = S - (n0 + 64 * w);
  const int64_t ldk = int64_t(p.heads_kv) * DQK, ldv = int64_t(p.heads_kv) * DV;
  const int64_t key0 = int64_t(b) * S + n0 + 64 * w;
  store_rows_bf16<DQK>(p.dk + key0 * ldk + int64_t(g) * DQK, ldk, dk, p.scale, row_in_wg, lane,
                       rows_valid);
  store_rows_bf16<DV>(p.dv + key0 * ldv + int64_t(g) * DV, ldv, dv, 1.f, row_in_wg, lane,
                      rows_valid);
}

// ---- dQ (deterministic) -------------------------------------------------------------------------
// One CTA per (batch, q head, 128 queries) recomputes S = Q Kᵀ and dP = dO Vᵀ per key tile of 64
// and accumulates dQ += dS K in registers (K as MN-major B): each dQ element is summed by one
// thread in ascending key order, so repeated runs agree bitwise.
// kPipe: the S and dP of key tile j + 1 are issued right behind dQ += dS K of tile j, so the
// tensor cores go from one to the other without waiting for this warpgroup's issue (S, dP and dQ
// take 160 accumulator registers at 192/128, leaving room for the second set of S and dP).
template <int DQK, int DV, bool kPipe>
__global__ void __launch_bounds__(kThreads, 1) dq_sm90_kernel(const __grid_constant__ BwdParams p) {
  using C = DqConfig<DQK, DV>;
  constexpr int BM = C::kBM, BN = C::kBN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base + C::kQOff, sDO = base + C::kDOOff;
  const uint32_t sK = base + C::kKOff, sV = base + C::kVOff;
  const uint32_t bar = base + C::kBarOff;
  auto q_full = [&] { return bar; };
  auto kv_full = [&](int s) { return bar + 8 + 8 * s; };
  auto kv_empty = [&](int s) { return bar + 24 + 8 * s; };

  const int b = int(blockIdx.x) / p.heads_q, h = int(blockIdx.x) % p.heads_q, g = h / p.group;
  const int num_m_blocks = (p.seq + BM - 1) / BM;
  const int m0 = (num_m_blocks - 1 - int(blockIdx.y)) * BM;  // heaviest (causal) blocks first
  const int S = p.seq;
  const int kv_end = p.causal ? min(S, m0 + BM) : S;
  const int n_tiles = (kv_end + BN - 1) / BN;  // >= 1: m0 < S

  if (threadIdx.x == 0) {
    mbar_init(q_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(kv_full(s), 1);
      mbar_init(kv_empty(s), kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&p.tm_k);
      tma_prefetch_map(&p.tm_v);
      mbar_arrive_expect_tx(q_full(), C::kQBytes + C::kDOBytes);
#pragma unroll
      for (int c = 0; c < DQK / 64; ++c)
        tma_load_4d(&p.tm_q, sQ + c * BM * 128, q_full(), c * 64, h, m0, b);
#pragma unroll
      for (int c = 0; c < DV / 64; ++c)
        tma_load_4d(&p.tm_do, sDO + c * BM * 128, q_full(), c * 64, h, m0, b);
      for (int it = 0; it < n_tiles; ++it) {
        const int st = it & 1;
        mbar_wait(kv_empty(st), ((it >> 1) & 1) ^ 1);
        mbar_arrive_expect_tx(kv_full(st), C::kKBytes + C::kVBytes);
#pragma unroll
        for (int c = 0; c < DQK / 64; ++c)
          tma_load_4d(&p.tm_k, sK + st * C::kKBytes + c * BN * 128, kv_full(st), c * 64, g, it * BN,
                      b);
#pragma unroll
        for (int c = 0; c < DV / 64; ++c)
          tma_load_4d(&p.tm_v, sV + st * C::kVBytes + c * BN * 128, kv_full(st), c * 64, g, it * BN,
                      b);
      }
    }
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const int w = wg - 1, t_in = int(threadIdx.x) - 128 * wg, lane = t_in & 31;
  const int row_in_wg = 16 * (t_in >> 5) + (lane >> 2);
  const int row = m0 + 64 * w + row_in_wg;  // upper query row; the lower one is +8
  const uint32_t q_rows = sQ + w * 64 * 128, do_rows = sDO + w * 64 * 128;
  const bool causal = p.causal != 0;
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t at = (int64_t(b) * p.heads_q + h) * S + row + 8 * r;
    lse2[r] = row + 8 * r < S ? p.lse[at] * kLog2e : 0.f;
    dlt[r] = row + 8 * r < S ? p.delta[at] : 0.f;
  }
  float dq[DQK / 2];
#pragma unroll
  for (int i = 0; i < DQK / 2; ++i) dq[i] = 0.f;

  mbar_wait(q_full(), 0);
  float s[32], dp[32];
  // S = Q Kᵀ and dP = dO Vᵀ of key tile `it`, once its stage has landed (not committed).
  auto issue_scores = [&](int it) {
    const int st = it & 1;
    mbar_wait(kv_full(st), (it >> 1) & 1);
    wgmma_n64_kmajor<DQK>(s, q_rows, BM * 128, sK + st * C::kKBytes, BN * 128);
    wgmma_n64_kmajor<DV>(dp, do_rows, BM * 128, sV + st * C::kVBytes, BN * 128);
  };
  if constexpr (kPipe) {
    wgmma_fence();
    issue_scores(0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
  }
  for (int it = 0; it < n_tiles; ++it) {
    const int st = it & 1, n0 = it * BN;
    const uint32_t k_t = sK + st * C::kKBytes;
    if constexpr (!kPipe) {
      wgmma_fence();
      issue_scores(it);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(dp);
    }
    const bool need_mask =
        n0 + BN > S || m0 + 64 * w + 64 > S || (causal && n0 + BN - 1 > m0 + 64 * w);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pe = attn::fast_exp2(fmaf(s[4 * j + e], p.scale_log2, -lse2[e >> 1]));
        if (need_mask) {
          const int key = n0 + 8 * j + 2 * (lane & 3) + (e & 1), query = row + 8 * (e >> 1);
          if (key >= S || query >= S || (causal && key > query)) pe = 0.f;
        }
        dp[4 * j + e] = pe * (dp[4 * j + e] - dlt[e >> 1]);
      }
    uint32_t dsr[16];
    acc_to_a_regs<64>(dsr, dp);
    wgmma_fence();
    fence_regs(dq);
    fence_regs(dsr);
    wgmma_regs_mnmajor<DQK, BN>(dq, dsr, k_t, BN * 128);
    wgmma_commit();
    const bool next = kPipe && it + 1 < n_tiles;
    if (next) {
      issue_scores(it + 1);  // the fence above covers s and dp (last touched before it)
      wgmma_commit();
      wgmma_wait<1>();  // groups retire in order: dQ of this tile is done
    } else {
      wgmma_wait<0>();
    }
    fence_regs(dq);
    fence_regs(dsr);
    if (lane == 0) mbar_arrive(kv_empty(st));
    if (next) {
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(dp);
    }
  }
  const int64_t ldq = int64_t(p.heads_q) * DQK;
  store_rows_bf16<DQK>(p.dq + (int64_t(b) * S + m0 + 64 * w) * ldq + int64_t(h) * DQK, ldq, dq,
                       p.scale, row_in_wg, lane, S - (m0 + 64 * w));
}

// ---- atomic dQ: fp32 accumulator * scale -> bf16 ------------------------------------------------
__global__ void dq_convert_kernel(const float* acc, bf16* dq, float scale, int64_t n2) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n2;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float2 a = reinterpret_cast<const float2*>(acc)[i];
    reinterpret_cast<uint32_t*>(dq)[i] = pack_bf16x2(a.x * scale, a.y * scale);
  }
}

// ---- host ---------------------------------------------------------------------------------------

void encode_map(CUtensorMap* map, const void* ptr, int64_t d, int64_t heads, int64_t seq,
                int64_t batch, uint32_t box_rows) {
  const uint64_t dims[4] = {uint64_t(d), uint64_t(heads), uint64_t(seq), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(d * 2), uint64_t(heads * d * 2),
                               uint64_t(seq * heads * d * 2)};
  const uint32_t box[4] = {64, 1, box_rows, 1};
  const CUresult rc = encode_tensor_map_bf16_4d(map, ptr, dims, strides, box);
  MT_CHECK(rc == CUDA_SUCCESS,
           "attention backward sm90: cuTensorMapEncodeTiled failed with CUresult {} for [B {}, S "
           "{}, H {}, D {}] at {} (box rows {}); the driver may be older than CUDA 12",
           int(rc), batch, seq, heads, d, ptr, box_rows);
}

struct Buffers {
  const void *q, *k, *v, *dout;
  const float *lse, *delta;
  void *dq, *dk, *dv;
  float* dq_accum;
};

BwdParams make_params(const AttnShape& s, const Buffers& x, uint32_t q_rows, uint32_t k_rows) {
  BwdParams p;
  encode_map(&p.tm_q, x.q, s.dim_qk, s.heads_q, s.seq, s.batch, q_rows);
  encode_map(&p.tm_do, x.dout, s.dim_v, s.heads_q, s.seq, s.batch, q_rows);
  encode_map(&p.tm_k, x.k, s.dim_qk, s.heads_kv, s.seq, s.batch, k_rows);
  encode_map(&p.tm_v, x.v, s.dim_v, s.heads_kv, s.seq, s.batch, k_rows);
  p.lse = x.lse;
  p.delta = x.delta;
  p.dq = static_cast<bf16*>(x.dq);
  p.dk = static_cast<bf16*>(x.dk);
  p.dv = static_cast<bf16*>(x.dv);
  p.dq_accum = x.dq_accum;
  p.seq = int(s.seq);
  p.heads_q = int(s.heads_q);
  p.heads_kv = int(s.heads_kv);
  p.group = int(s.heads_q / s.heads_kv);
  p.scale = float(s.scale);
  p.scale_log2 = float(s.scale * M_LOG2E);
  p.causal = s.causal ? 1 : 0;
  return p;
}

template <int DQK, int DV, bool kAtomicDq, bool kWideRegs>
void launch_dkdv(const AttnShape& s, const Buffers& x, cudaStream_t stream) {
  using C = DkdvConfig<DQK, DV>;
  constexpr auto kernel = dkdv_sm90_kernel<DQK, DV, kAtomicDq, kWideRegs>;
  attn::set_smem_limit_once<kernel>(C::kSmem);
  const BwdParams p = make_params(s, x, C::kBM, C::kBN);
  const dim3 grid(unsigned(s.batch * s.heads_kv), unsigned((s.seq + C::kBN - 1) / C::kBN));
  kernel<<<grid, kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH("attention_bwd_dkdv_bf16_sm90");
}

template <int DQK, int DV, bool kPipe>
void launch_dq(const AttnShape& s, const Buffers& x, cudaStream_t stream) {
  using C = DqConfig<DQK, DV>;
  constexpr auto kernel = dq_sm90_kernel<DQK, DV, kPipe>;
  attn::set_smem_limit_once<kernel>(C::kSmem);
  const BwdParams p = make_params(s, x, C::kBM, C::kBN);
  const dim3 grid(unsigned(s.batch * s.heads_q), unsigned((s.seq + C::kBM - 1) / C::kBM));
  kernel<<<grid, kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH("attention_bwd_dq_bf16_sm90");
}

// The dK/dV and dQ stages of one variant (delta is computed before either).
template <int DQK, int DV, bool kAtomicDq, bool kPipe = false, bool kWideRegs = false>
void run(const AttnShape& s, const Buffers& x, cudaStream_t stream, AttnBwdPasses passes) {
  const bool all = passes == AttnBwdPasses::kAll;
  if constexpr (kAtomicDq) {
    // One kernel makes dK, dV and the dQ sums; kDkdv and kDq both time all of it.
    if (passes == AttnBwdPasses::kDelta) return;
    const int64_t n = s.batch * s.seq * s.heads_q * DQK;
    CUDA_CHECK(cudaMemsetAsync(x.dq_accum, 0, size_t(n) * sizeof(float), stream));
    launch_dkdv<DQK, DV, true, kWideRegs>(s, x, stream);
    const int64_t blocks = std::min<int64_t>((n / 2 + 255) / 256, 132 * 16);
    if (blocks > 0) {
      dq_convert_kernel<<<unsigned(blocks), 256, 0, stream>>>(x.dq_accum, static_cast<bf16*>(x.dq),
                                                              float(s.scale), n / 2);
      CUDA_CHECK_LAUNCH("attention_bwd_dq_convert_sm90");
    }
  } else {
    if (all || passes == AttnBwdPasses::kDkdv) launch_dkdv<DQK, DV, false, kWideRegs>(s, x, stream);
    if (s.heads_q > 0 && (all || passes == AttnBwdPasses::kDq))
      launch_dq<DQK, DV, kPipe>(s, x, stream);
  }
}

using Run = void (*)(const AttnShape&, const Buffers&, cudaStream_t, AttnBwdPasses);
struct Variant {
  int dim_qk, dim_v;
  bool atomic_dq;
  const char* name;
  Run run;
};
// The first of each head-dim pair is the default (deterministic); bench_attention times them all.
// At 192/128 the 24/240 register split leads: at 40/232 ptxas serializes the dK/dV wgmma (C7512)
// and the H200 measured 372.3 against 355.2 TFLOP/s (bench/kernels/NOTES.md, 2026-12-07).
constexpr Variant kVariants[] = {
    {192, 128, false, "wgmma dkdv 24/240 regs + dq pass", &run<192, 128, false, false, true>},
    {192, 128, false, "wgmma dkdv + dq pass", &run<192, 128, false>},
    {192, 128, true, "wgmma atomic dq (nondeterministic)", &run<192, 128, true>},
    {192, 128, false, "wgmma dkdv + dq pass pipelined", &run<192, 128, false, true>},
    {128, 128, false, "wgmma dkdv + dq pass", &run<128, 128, false>},
    {128, 128, true, "wgmma atomic dq (nondeterministic)", &run<128, 128, true>},
    {128, 128, false, "wgmma dkdv + dq pass pipelined", &run<128, 128, false, true>},
};

const Variant* find_variant(int64_t dqk, int64_t dv, int variant) {
  int seen = 0;
  for (const Variant& f : kVariants)
    if (f.dim_qk == dqk && f.dim_v == dv && seen++ == variant) return &f;
  return nullptr;
}

}  // namespace sm90bwd

bool attention_bwd_bf16_sm90_supports(const AttnShape& s) {
  // The forward's test covers the rest: compute capability 9.0, GQA, index ranges.
  return sm90bwd::find_variant(s.dim_qk, s.dim_v, 0) != nullptr &&
         attention_fwd_bf16_sm90_supports(s);
}

int attention_bwd_bf16_sm90_num_variants(int64_t dim_qk, int64_t dim_v) {
  int n = 0;
  for (const sm90bwd::Variant& f : sm90bwd::kVariants) n += f.dim_qk == dim_qk && f.dim_v == dim_v;
  return n;
}

const char* attention_bwd_bf16_sm90_variant_name(int64_t dim_qk, int64_t dim_v, int variant) {
  const sm90bwd::Variant* f = sm90bwd::find_variant(dim_qk, dim_v, variant);
  return f ? f->name : nullptr;
}

bool attention_bwd_bf16_sm90_variant_deterministic(int64_t dim_qk, int64_t dim_v, int variant) {
  const sm90bwd::Variant* f = sm90bwd::find_variant(dim_qk, dim_v, variant);
  return f != nullptr && !f->atomic_dq;
}

size_t attention_bwd_bf16_sm90_workspace_bytes(const AttnShape& s, int variant) {
  const sm90bwd::Variant* f = sm90bwd::find_variant(s.dim_qk, s.dim_v, variant);
  return attention_bwd_sm90_workspace_bytes(s.batch, s.seq, s.heads_q, s.dim_qk,
                                            f != nullptr && f->atomic_dq);
}

bool attention_bwd_bf16_sm90(const AttnShape& s, const void* q, const void* k, const void* v,
                             const void* out, const float* lse, const void* dout, void* dq,
                             void* dk, void* dv, float* workspace, cudaStream_t stream, int variant,
                             AttnBwdPasses passes) {
  const sm90bwd::Variant* f = sm90bwd::find_variant(s.dim_qk, s.dim_v, variant);
  if (!f || !attention_bwd_bf16_sm90_supports(s)) return false;
  for (const void* ptr : {q, k, v, out, dout, static_cast<const void*>(dq),
                          static_cast<const void*>(dk), static_cast<const void*>(dv)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;  // TMA needs 16-byte bases
  if (s.batch * s.seq == 0) return true;                           // every output is empty
  // delta = rowsum(dout * out) by the mma.sync path's pass (it takes these head dims).
  if (passes == AttnBwdPasses::kAll || passes == AttnBwdPasses::kDelta)
    MT_CHECK(attention_bwd_bf16(s, q, k, v, out, lse, dout, dq, dk, dv, workspace, stream,
                                AttnBwdPasses::kDelta),
             "attention backward sm90: the delta pass refused head dims ({}, {})", s.dim_qk,
             s.dim_v);
  float* dq_accum =
      workspace + attention_bwd_sm90_delta_bytes(s.batch, s.seq, s.heads_q) / sizeof(float);
  const sm90bwd::Buffers x{q,         k,  v,  dout, lse,
                           workspace, dq, dk, dv,   f->atomic_dq ? dq_accum : nullptr};
  f->run(s, x, stream, passes);
  return true;
}

}  // namespace meshtrain::cuda
