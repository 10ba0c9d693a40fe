// The kernel of meshtrain's Hopper grouped GEMM (grouped_gemm_sm90.h; the host side is
// grouped_gemm_sm90.cu): one persistent kernel over every (expert, row tile, column tile) of a
// grouped GEMM, the groups read from device memory.
//
// Each CTA (one per SM) first turns the groups into a prefix of tile counts in shared memory, then
// walks the tiles t = blockIdx.x, + gridDim.x, ... (expert-major, columns fastest, so the CTAs
// working at one time share an expert's weight and rows in L2). Warp 0 of warpgroup 0 issues the
// TMA loads of every k-block of its tiles into a ring of stages (full/empty mbarriers, the ring
// running on across tiles); warpgroups 1 and 2 take the upper and lower half of the tile's rows
// (64 or 128 each), issue wgmma from shared memory (one group kept in flight) and store their
// accumulators. The pingpong
// variant gives each consumer warpgroup every other tile whole instead, their main loops taking
// turns, so that one's epilogue runs under the other's MMAs. The cluster variant runs CTAs in
// pairs over two row tiles of one (expert, column tile), each TMA-multicasting half of the shared
// B tile into both, which halves the L2 traffic of B.
//
// Three operand forms (the row-major names of the ops):
//   forward  y = x · w_eᵀ : A = x rows, K-major; B = w_e [n, k], K-major.
//   dgrad    y = x · w_e  : A = x rows, K-major; B = w_e [k, n], MN-major (n contiguous).
//   wgrad    out_e = aᵀ b : M = p, N = q, K = the expert's rows; A = a rows, MN-major (p
//            contiguous); B = b rows, MN-major. The last k-block of an expert reaches into the next
//            expert's rows: the consumers zero those rows of both tiles in shared memory first.
// Rows past the expert (forward, dgrad) are computed from whatever follows and never stored.
#pragma once

#include "meshtrain/moe/cuda/grouped_gemm_sm90.h"
#include "meshtrain/ops/cuda/attention_mma.cuh"
#include "meshtrain/ops/cuda/hopper_mma.cuh"

namespace meshtrain::cuda::gg90 {

using namespace hopper;

enum class Form : int { kForward, kDgrad, kWgrad };

constexpr int kBK = 64, kThreads = 384;
constexpr int kMaxE = int(kGroupedSm90MaxExperts);
constexpr uint32_t kConsumerWarps = 8;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr uint32_t kBlockBytes = 64 * 128;  // one [64 rows][64 bf16] swizzled block

template <int BM, int BN, int STAGES, bool TS>
struct Cfg {
  static_assert(BN == 128 || BN == 256, "wgmma n128 or n256 per consumer warpgroup");
  static_assert(BM == 128 || BM == 256, "one or two m64 halves per consumer warpgroup");
  static constexpr uint32_t kABytes = BM * kBK * 2;  // 16 or 32 KiB
  static constexpr uint32_t kBBytes = BN * kBK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  // TS: the output tile's staging for its TMA store (bf16, one 64-row half per consumer
  // warpgroup, in 64-column swizzled blocks), after the ring.
  static constexpr uint32_t kOutOff = STAGES * kStageBytes;
  static constexpr uint32_t kOutHalfBytes = 64 * BN * 2;
  static constexpr uint32_t kTablesOff = kOutOff + (TS ? BM * BN * 2 : 0);
  // tile_end[kMaxE] (inclusive prefix of tiles), start[kMaxE], count[kMaxE]
  static constexpr uint32_t kBarOff = kTablesOff + 3 * kMaxE * 4;
  static constexpr size_t kSmem = kBarOff + 2 * STAGES * 8 + 1024;  // + alignment slack
  static_assert(kSmem <= 227 * 1024, "shared memory per CTA");
};

struct Params {
  CUtensorMap tm_a, tm_b;
  CUtensorMap tm_y;  // forward and dgrad under a TMA-store variant: y [rows, n], 64 x 64 boxes
  void* out;
  const int32_t* groups;
  int experts, rows;  // rows: the row count of x / a / b (groups are clipped to it)
  int m_ext;          // wgrad: p (forward, dgrad: unused, the group's count is M)
  int n_ext, k_ext;   // forward, dgrad: n and k; wgrad: q (k_ext unused)
  int out_f32, accumulate;
};

__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// PING false (cooperative): both consumer warpgroups share every tile, 64 rows each. PING true
// (pingpong): each warpgroup takes every other tile of its CTA whole (two m64 halves), and the two
// run their main loops in turn (named barriers 2 and 3 hand over the ring), so one warpgroup's
// epilogue runs under the other's MMAs. CL 2: clusters of two CTAs take row tiles 2u and 2u + 1
// of one (expert, column tile) and share its B tile: each loads half of it, multicast into both,
// so every stage frees only when the consumers of both CTAs have released it (remote arrivals).
// TS: the forward's and dgrad's whole 64-row halves leave through shared memory (stmatrix) and a
// TMA store that runs under the next tile's main loop; a half that reaches past its expert's
// rows is stored from registers (the TMA box cannot stop at the expert's last row).
template <Form F, int BM, int BN, int STAGES, bool PING, int CL, bool TS>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ Params p) {
  static_assert(CL == 1 || (CL == 2 && !PING), "2-CTA clusters with the cooperative consumers");
  static_assert(BM == 128 || !PING, "pingpong: one 128-row tile per warpgroup");
  static_assert(!TS || (BM == 128 && !PING), "TMA-store epilogue: cooperative 128-row tiles");
  using C = Cfg<BM, BN, STAGES, TS>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  int* tile_end = reinterpret_cast<int*>(smem_raw + (base + C::kTablesOff - smem_u32(smem_raw)));
  int* g_start = tile_end + kMaxE;
  int* g_count = g_start + kMaxE;
  const uint32_t bar = base + C::kBarOff;
  auto full = [&](int s) { return bar + 8 * s; };
  auto empty = [&](int s) { return bar + 8 * (STAGES + s); };

  const int E = p.experts;
  const int n_tiles = (p.n_ext + BN - 1) / BN;
  const int m_tiles_wgrad = (p.m_ext + BM - 1) / BM;
  for (int e = int(threadIdx.x); e < E; e += kThreads) {
    const int start = min(max(p.groups[e], 0), p.rows);
    const int count = min(max(p.groups[E + e], 0), p.rows - start);
    g_start[e] = start;
    g_count[e] = count;
    // Work units: CL row tiles (one per CTA of a cluster) of one column tile.
    const int m_tiles = F == Form::kWgrad ? m_tiles_wgrad : (count + BM - 1) / BM;
    tile_end[e] = (m_tiles + CL - 1) / CL * n_tiles;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), (PING ? kConsumerWarps / 2 : kConsumerWarps) * CL);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // inclusive prefix of the tile counts, 32 experts at a time
    const int lane = int(threadIdx.x);
    int carry = 0;
    for (int b0 = 0; b0 < E; b0 += 32) {
      const int i = b0 + lane;
      int v = i < E ? tile_end[i] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
      }
      v += carry;
      if (i < E) tile_end[i] = v;
      carry = __shfl_sync(0xffffffffu, v, 31);
    }
  }
  __syncthreads();
  // The peer's barriers are initialised before any multicast or remote arrival reaches them.
  if constexpr (CL > 1) cluster_sync();
  const int total = E > 0 ? tile_end[E - 1] : 0;
  const int rank = CL > 1 ? int(cluster_ctarank()) : 0;  // blockIdx.x % CL for (CL, 1, 1)
  const int first_unit = int(blockIdx.x) / CL, unit_step = int(gridDim.x) / CL;
  // Tile t -> (expert, row tile, column tile): the first expert whose prefix passes t.
  auto decode = [&](int t, int& e, int& mt, int& nt) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (tile_end[mid] > t)
        hi = mid;
      else
        lo = mid + 1;
    }
    e = lo;
    const int local = t - (e > 0 ? tile_end[e - 1] : 0);
    const int unit = local / n_tiles;
    nt = local - unit * n_tiles;
    mt = unit * CL + rank;
  };
  auto k_blocks = [&](int e) {
    return F == Form::kWgrad ? (g_count[e] + kBK - 1) / kBK : (p.k_ext + kBK - 1) / kBK;
  };

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&p.tm_a);
      tma_prefetch_map(&p.tm_b);
      int it = 0;
      constexpr int kBBlocks = BN / 64 / CL;  // MN-major B blocks this CTA loads (and multicasts)
      // B's boxes: into this CTA alone, or under clusters into every CTA of the cluster.
      auto load_b_2d = [&](uint32_t dst, uint32_t bar, int c0, int c1) {
        if constexpr (CL > 1)
          tma_load_2d_multicast(&p.tm_b, dst, bar, c0, c1, uint16_t((1u << CL) - 1));
        else
          tma_load_2d(&p.tm_b, dst, bar, c0, c1);
      };
      auto load_b_3d = [&](uint32_t dst, uint32_t bar, int c0, int c1, int c2) {
        if constexpr (CL > 1)
          tma_load_3d_multicast(&p.tm_b, dst, bar, c0, c1, c2, uint16_t((1u << CL) - 1));
        else
          tma_load_3d(&p.tm_b, dst, bar, c0, c1, c2);
      };
      for (int t = first_unit; t < total; t += unit_step) {
        int e, mt, nt;
        decode(t, e, mt, nt);
        const int nk = k_blocks(e);
        for (int kb = 0; kb < nk; ++kb, ++it) {
          const int s = it % STAGES;
          mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
          mbar_arrive_expect_tx(full(s), C::kStageBytes);
          const uint32_t sa = base + s * C::kStageBytes, sb = sa + C::kABytes;
          if constexpr (F == Form::kWgrad) {
            const int r0 = g_start[e] + kb * kBK;
#pragma unroll
            for (int c = 0; c < BM / 64; ++c)
              tma_load_2d(&p.tm_a, sa + c * kBlockBytes, full(s), mt * BM + 64 * c, r0);
#pragma unroll
            for (int i = 0; i < kBBlocks; ++i) {
              const int c = rank * kBBlocks + i;
              load_b_2d(sb + c * kBlockBytes, full(s), nt * BN + 64 * c, r0);
            }
          } else {
            tma_load_2d(&p.tm_a, sa, full(s), kb * kBK, g_start[e] + mt * BM);
            if constexpr (F == Form::kForward) {
              // K-major B: this CTA's BN / CL rows (the map's box), at their place in the tile.
              constexpr int kRows = BN / CL;
              load_b_3d(sb + rank * kRows * 128, full(s), kb * kBK, nt * BN + rank * kRows, e);
            } else {
#pragma unroll
              for (int i = 0; i < kBBlocks; ++i) {
                const int c = rank * kBBlocks + i;
                load_b_3d(sb + c * kBlockBytes, full(s), nt * BN + 64 * c, kb * kBK, e);
              }
            }
          }
        }
      }
      // Under clusters, stay until both CTAs' consumers have released every stage: the peer's
      // remote arrivals land on this CTA's barriers, and this CTA's multicasts on the peer's.
      if constexpr (CL > 1)
        for (int i = 0; i < STAGES; ++i, ++it)
          mbar_wait(empty(it % STAGES), ((it / STAGES) & 1) ^ 1);
    }
    return;
  }

  // ---- consumers ------------------------------------------------------------------------------
  setmaxnreg_inc<kConsumerRegs>();
  const int w = wg - 1, t_in = int(threadIdx.x) - 128 * wg, lane = t_in & 31;
  const int row_in_wg = 16 * (t_in >> 5) + (lane >> 2);  // upper accumulator row; +8 the lower
  constexpr int kTransA = F == Form::kWgrad ? 1 : 0;
  constexpr int kTransB = F == Form::kForward ? 0 : 1;
  // The 64-row halves of the tile this warpgroup computes: under PING all (two) of its own tile;
  // else its share of the tile both compute, halves kHalves·w ... kHalves·w + kHalves - 1.
  constexpr int kHalves = PING ? 2 : BM / 128;
  auto half_of = [&](int h) { return PING ? h : kHalves * w + h; };
  float acc[kHalves][BN / 2];
  int it = 0;
  // The CTA's tiles in order (j); under PING warpgroup w owns the tiles with j % 2 == w and skips
  // the others' k-blocks in the ring count. Its first full-barrier wait on a tile comes after the
  // other warpgroup's last on the previous tile (barrier 2 + w), so the ring's phases are met in
  // order: no wait can see a stage's previous phase as this one.
  int j = 0;
  const int my_tiles = (total - first_unit + unit_step - 1) / unit_step;
  auto release = [&](int stage) {  // lane 0 of each consumer warp
    mbar_arrive(empty(stage));
    if constexpr (CL > 1) mbar_arrive_cluster(empty(stage), uint32_t(rank ^ 1));
  };
  for (int t = first_unit; t < total; t += unit_step, ++j) {
    int e, mt, nt;
    decode(t, e, mt, nt);
    const int count = g_count[e];
    const int nk = k_blocks(e);
    if (PING && (j & 1) != w) {
      it += nk;
      continue;
    }
    if (PING && j > 0) named_bar_sync(2 + w, 256);  // the previous tile's main loop is done
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[h][i] = 0.f;
    int prev = -1;
    for (int kb = 0; kb < nk; ++kb, ++it) {
      const int s = it % STAGES;
      mbar_wait(full(s), (it / STAGES) & 1);
      const uint32_t sa = base + s * C::kStageBytes, sb = sa + C::kABytes;
      if constexpr (F == Form::kWgrad) {
        const int valid = count - kb * kBK;
        if (valid < kBK) {
          // K rows valid..63 belong to the next expert (or lie past the buffer): zero them in
          // every block of both tiles (a K row is one whole 128-byte row of a block), make the
          // stores visible to wgmma, and wait for the other warpgroup's half.
          constexpr int kABlocks = BM / 64, kBlocks = kABlocks + BN / 64;
          constexpr int kZeroThreads = PING ? 128 : 256;  // the threads reading this stage
          const int chunks = kBlocks * (kBK - valid) * 8;
          for (int i = t_in + (PING ? 0 : 128 * w); i < chunks; i += kZeroThreads) {
            const int blk = i / ((kBK - valid) * 8), rem = i - blk * (kBK - valid) * 8;
            const int r = valid + rem / 8, ch = rem % 8;
            const uint32_t tile =
                blk < kABlocks ? sa + blk * kBlockBytes : sb + (blk - kABlocks) * kBlockBytes;
            st_shared_zero16(tile + r * 128 + ch * 16);
          }
          fence_proxy_async_smem();
          named_bar_sync(PING ? 4 + w : 1, kZeroThreads);
        }
      }
      // A half: rows 64·half.. of a K-major tile, or M block `half` of an MN-major one.
      uint64_t da[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const uint32_t a_rows = sa + half_of(h) * kBlockBytes;
        da[h] = kTransA ? wgmma_desc_sw128(a_rows, kBlockBytes, kSw128Sbo)
                        : wgmma_desc_sw128(a_rows, kKMajorLbo, kSw128Sbo);
      }
      const uint64_t db = kTransB ? wgmma_desc_sw128(sb, kBlockBytes, kSw128Sbo)
                                  : wgmma_desc_sw128(sb, kKMajorLbo, kSw128Sbo);
#pragma unroll
      for (int h = 0; h < kHalves; ++h) fence_regs(acc[h]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        // k16 step: 32 bytes along a K-major row, 16 rows (2048 bytes) down an MN-major block.
        const uint32_t ao = kTransA ? ks * 2048 : ks * 32, bo = kTransB ? ks * 2048 : ks * 32;
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          if constexpr (BN == 128)
            wgmma_m64n128k16_ss_acc<kTransA, kTransB>(acc[h], da[h] + (ao >> 4), db + (bo >> 4));
          else
            wgmma_m64n256k16_ss_acc<kTransA, kTransB>(acc[h], da[h] + (ao >> 4), db + (bo >> 4));
        }
      }
      wgmma_commit();
      wgmma_wait<1>();  // the previous k-block's group is done: its stage goes back
#pragma unroll
      for (int h = 0; h < kHalves; ++h) fence_regs(acc[h]);
      if (prev >= 0 && lane == 0) release(prev);
      prev = s;
    }
    // Every full-barrier wait of this tile is behind us: the other warpgroup may start its tile.
    if (PING && j + 1 < my_tiles) named_bar_arrive(2 + (1 - w), 256);
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < kHalves; ++h) fence_regs(acc[h]);
    if (prev >= 0 && lane == 0) release(prev);

    // ---- epilogue: accumulator (row 16·warp + lane/4 + 8r, column 8c + 2·(lane%4)) -> global
    const int col0 = nt * BN + 2 * (lane & 3);
    if constexpr (F == Form::kWgrad) {
      if (count == 0 && p.accumulate) continue;  // nothing to add: leave the gradient
      const int64_t q = p.n_ext;
#pragma unroll
      for (int hr = 0; hr < 2 * kHalves; ++hr) {
        const int h = hr >> 1, r = hr & 1;
        const int m = mt * BM + 64 * half_of(h) + row_in_wg + 8 * r;
        if (m >= p.m_ext) continue;
        const int64_t row_at = (int64_t(e) * p.m_ext + m) * q;
        if (p.out_f32) {
          float* dst = static_cast<float*>(p.out) + row_at;
#pragma unroll
          for (int c = 0; c < BN / 8; ++c) {
            const int col = col0 + 8 * c;
            if (col >= q) continue;
            float2 v = make_float2(acc[h][4 * c + 2 * r], acc[h][4 * c + 2 * r + 1]);
            if (p.accumulate) {
              const float2 old = *reinterpret_cast<const float2*>(dst + col);
              v.x += old.x;
              v.y += old.y;
            }
            *reinterpret_cast<float2*>(dst + col) = v;
          }
        } else {
          attn::bf16* dst = static_cast<attn::bf16*>(p.out) + row_at;
#pragma unroll
          for (int c = 0; c < BN / 8; ++c) {
            const int col = col0 + 8 * c;
            if (col < q)
              *reinterpret_cast<uint32_t*>(dst + col) =
                  pack_bf16x2(acc[h][4 * c + 2 * r], acc[h][4 * c + 2 * r + 1]);
          }
        }
      }
    } else {
      const int64_t n = p.n_ext;
      if constexpr (TS) {
        const int rows0 = mt * BM + 64 * w;  // this warpgroup's first row in the expert
        if (rows0 + 64 <= count) {
          const uint32_t stage_out = base + C::kOutOff + w * C::kOutHalfBytes;
          if (t_in == 0) tma_store_wait_read();  // the previous tile's store has read it
          named_bar_sync(2 + w, 128);
          const int warp = t_in >> 5, mat = lane >> 3, mrow = lane & 7;
          const int srow = 16 * warp + 8 * (mat & 1) + mrow;  // the row this lane addresses
#pragma unroll
          for (int c = 0; c < BN / 8; c += 2)
            stmatrix_x4(stage_out + sw128_offset(64, srow, 8 * (c + (mat >> 1))),
                        pack_bf16x2(acc[0][4 * c], acc[0][4 * c + 1]),
                        pack_bf16x2(acc[0][4 * c + 2], acc[0][4 * c + 3]),
                        pack_bf16x2(acc[0][4 * c + 4], acc[0][4 * c + 5]),
                        pack_bf16x2(acc[0][4 * c + 6], acc[0][4 * c + 7]));
          fence_proxy_async_smem();
          named_bar_sync(2 + w, 128);
          if (t_in == 0) {
#pragma unroll
            for (int blk = 0; blk < BN / 64; ++blk)
              tma_store_2d(&p.tm_y, stage_out + blk * 64 * 128, nt * BN + 64 * blk,
                           g_start[e] + rows0);
            tma_store_commit();
          }
          continue;
        }
      }
#pragma unroll
      for (int hr = 0; hr < 2 * kHalves; ++hr) {
        const int h = hr >> 1, r = hr & 1;
        const int m = mt * BM + 64 * half_of(h) + row_in_wg + 8 * r;
        if (m >= count) continue;
        attn::bf16* dst = static_cast<attn::bf16*>(p.out) + (int64_t(g_start[e]) + m) * n;
#pragma unroll
        for (int c = 0; c < BN / 8; ++c) {
          const int col = col0 + 8 * c;
          if (col < n)
            *reinterpret_cast<uint32_t*>(dst + col) =
                pack_bf16x2(acc[h][4 * c + 2 * r], acc[h][4 * c + 2 * r + 1]);
        }
      }
    }
  }
  // The staging stays allocated until the last TMA store has read it and written global memory.
  if constexpr (TS)
    if (t_in == 0) tma_store_wait_all();
}

}  // namespace meshtrain::cuda::gg90
