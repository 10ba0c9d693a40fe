// Internal to the Hopper attention backward (attention_bwd_sm90.cu): the parameter block, the
// shared-memory layouts of its two kernels (dK/dV per key tile, dQ per query tile) and the wgmma
// loops they share. Every smem tile is a 128-byte swizzled column-block tile (hopper_mma.cuh).
#pragma once

#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/attention_mma.cuh"
#include "meshtrain/ops/cuda/hopper_mma.cuh"

namespace meshtrain::cuda::sm90bwd {

using namespace hopper;
using attn::bf16;

struct BwdParams {
  // q/dO and k/v maps; the box rows depend on the kernel (its query / key tile).
  CUtensorMap tm_q, tm_do, tm_k, tm_v;
  const float* lse;    // [B, Hq, S], natural log
  const float* delta;  // [B, Hq, S], rowsum(dout * out)
  bf16* dq;            // [B, S, Hq, Dqk]
  bf16* dk;            // [B, S, Hkv, Dqk]
  bf16* dv;            // [B, S, Hkv, Dv]
  float* dq_accum;     // [B, S, Hq, Dqk] fp32, zeroed (atomic-dQ variant only, else nullptr)
  int seq, heads_q, heads_kv, group;  // group = heads_q / heads_kv
  float scale, scale_log2;
  int causal;
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 384;  // warpgroup 0 produces, 1 and 2 compute
// setmaxnreg moves registers from the producer to the consumers within the CTA's 384 x 168:
// (168 - 40) * 128 = (232 - 168) * 256. kWideRegs: FlashAttention-3's 24 / 240 instead, for the
// dK/dV kernel at 192/128, whose 160 accumulators leave too little of 232 (ptxas serializes every
// wgmma there, C7512); at 24 the producer's lse/delta loop spills 12 bytes instead.
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
template <bool kWideRegs>
struct DkdvRegs {
  static constexpr int kProducer = kWideRegs ? 24 : kProducerRegs;
  static constexpr int kConsumer = kWideRegs ? 240 : kConsumerRegs;
  static_assert(kProducer * 128 + kConsumer * 256 <= 65536, "registers per CTA");
};
constexpr uint32_t kConsumerWarps = 8;

// dK/dV kernel: one CTA per (batch, kv head, 128 keys); consumer warpgroup w owns keys 64w..+63
// (wgmma's M is 64 per warpgroup and its dK, dV accumulators take (Dqk + Dv) / 2 registers per
// thread, so two warpgroups of 64 keys each share every Q / dO tile). Q, dO (64 query rows) and
// lse, delta stream through a two-stage ring; K and V stay. With the atomic dQ, the two
// warpgroups stage dSᵀ [128 keys][64 queries] bf16 (two stages) for dQ += dS K over all 128 keys.
template <int DQK, int DV>
struct DkdvConfig {
  static constexpr int kBN = 128, kBM = 64, kStages = 2;
  static constexpr uint32_t kKBytes = kBN * DQK * 2, kVBytes = kBN * DV * 2;
  static constexpr uint32_t kQBytes = kBM * DQK * 2, kDOBytes = kBM * DV * 2;
  static constexpr uint32_t kDSBytes = kBN * kBM * 2;  // per stage: [128 keys][64 queries]
  static constexpr uint32_t kKOff = 0, kVOff = kKBytes, kQOff = kVOff + kVBytes;
  static constexpr uint32_t kDOOff = kQOff + kStages * kQBytes;
  static constexpr uint32_t kDSOff = kDOOff + kStages * kDOBytes;
  static constexpr uint32_t kLseOff = kDSOff + kStages * kDSBytes;  // [stage][kBM] lse, then delta
  static constexpr uint32_t kBarOff = kLseOff + kStages * 2 * kBM * 4;
  static constexpr size_t kSmem = kBarOff + 8 * 8 + 1024;  // + alignment slack
  static_assert(DQK % 64 == 0 && DV == 128, "dV += Pᵀ dO is one m64n128 wgmma per k16 step");
  static_assert(DQK == 128 || DQK == 192, "dK += dSᵀ Q is one m64n128 / m64n192 per k16 step");
  static_assert(kSmem <= 227 * 1024, "shared memory per CTA");
};

// dQ kernel: one CTA per (batch, q head, 128 queries); consumer warpgroup w owns queries 64w..+63
// and walks the key tiles of 64 (S and dP take 32 registers each beside dQ's Dqk / 2). Q and dO
// stay; K and V stream through a two-stage ring.
template <int DQK, int DV>
struct DqConfig {
  static constexpr int kBM = 128, kBN = 64, kStages = 2;
  static constexpr uint32_t kQBytes = kBM * DQK * 2, kDOBytes = kBM * DV * 2;
  static constexpr uint32_t kKBytes = kBN * DQK * 2, kVBytes = kBN * DV * 2;
  static constexpr uint32_t kQOff = 0, kDOOff = kQBytes, kKOff = kDOOff + kDOBytes;
  static constexpr uint32_t kVOff = kKOff + kStages * kKBytes;
  static constexpr uint32_t kBarOff = kVOff + kStages * kVBytes;
  static constexpr size_t kSmem = kBarOff + 8 * 8 + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory per CTA");
};

// d[64 x 64] = A[64 x K] B[64 x K]ᵀ, both K-major swizzled tiles (64-column blocks a_block /
// b_block bytes apart; a and b address the first row used).
template <int K>
__device__ __forceinline__ void wgmma_n64_kmajor(float (&d)[32], uint32_t a, uint32_t a_block,
                                                 uint32_t b, uint32_t b_block) {
  const uint64_t da = wgmma_desc_sw128(a, kKMajorLbo, kSw128Sbo);
  const uint64_t db = wgmma_desc_sw128(b, kKMajorLbo, kSw128Sbo);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint32_t ao = (ks / 4) * a_block + (ks % 4) * 32, bo = (ks / 4) * b_block + (ks % 4) * 32;
    wgmma_m64n64k16_ss<0, 0>(d, da + (ao >> 4), db + (bo >> 4), ks > 0);
  }
}

// d[64 x N] += A[64 x K] B[K x N], A in registers (acc_to_a_regs of a K-column accumulator), B
// MN-major (K rows of 128 bytes per 64-column block, the blocks b_block bytes apart).
template <int N, int K>
__device__ __forceinline__ void wgmma_regs_mnmajor(float (&d)[N / 2], const uint32_t (&a)[K / 4],
                                                   uint32_t b, uint32_t b_block) {
  if constexpr (N == 128) {
    wgmma_m64n128_regs_mnmajor<K>(d, a, b, b_block);
  } else {
    static_assert(N == 192, "N is 128 or 192");
    const uint64_t db = wgmma_desc_sw128(b, b_block, kSw128Sbo);
#pragma unroll
    for (int k = 0; k < K / 16; ++k) {
      const uint32_t ak[4] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
      wgmma_m64n192k16_rs_bt(d, ak, db + ((k * 16 * kSwizzleBytes) >> 4), 1);
    }
  }
}

// Stores the 64-row accumulator `acc` (N columns) times `mul` as bf16 rows row0 + r of a
// [.., ld]-strided global matrix, skipping rows at or past `rows_valid` (relative to row0).
template <int N>
__device__ __forceinline__ void store_rows_bf16(bf16* dst, int64_t ld, const float (&acc)[N / 2],
                                                float mul, int row_in_wg, int lane,
                                                int rows_valid) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = row_in_wg + 8 * r;
    if (rr >= rows_valid) continue;
    bf16* row = dst + int64_t(rr) * ld + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
      *reinterpret_cast<uint32_t*>(row + 8 * j) =
          pack_bf16x2(acc[4 * j + 2 * r] * mul, acc[4 * j + 2 * r + 1] * mul);
  }
}

}  // namespace meshtrain::cuda::sm90bwd
