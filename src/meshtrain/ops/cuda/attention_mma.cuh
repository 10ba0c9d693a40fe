// Warp-level building blocks of the bf16 attention kernels: cp.async tile loads into swizzled
// shared memory, ldmatrix fragment loads and mma.sync m16n8k16 (bf16 in, fp32 accumulate).
// Rule: every smem tile is [rows][D] bf16 with its 16-byte chunks XOR-swizzled by (row % 8), so
// ldmatrix (8 rows x 16 bytes) and cp.async stores hit 32 distinct banks. D must divide by 64.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <mutex>

#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda::attn {

using bf16 = __nv_bfloat16;

// Element offset of (row, col) in a swizzled [rows][D] tile; col % 8 == 0 for chunk starts.
template <int D>
__host__ __device__ __forceinline__ int swz(int row, int col) {
  static_assert(D % 64 == 0, "swizzled tiles need rows of a multiple of 8 chunks");
  return row * D + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}
// 4-byte async copy (lse, delta rows), zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tile copies split each row into 64-column segments of eight 16-byte chunks: lane group
// tid/8 takes rows tid/8 + i*(THREADS/8), chunk tid%8 of every segment. THREADS/8 is a multiple
// of 8, so a thread's rows share row % 8 and its swizzled smem offsets differ by constants; the
// per-thread state is one smem offset and one global pointer (few registers, which the main loops
// need more).
template <int ROWS, int D, int THREADS>
struct TileCopy {
  static constexpr int kRowStep = THREADS / 8;
  static_assert(THREADS % 64 == 0 && ROWS % kRowStep == 0 && D % 64 == 0, "tile copy shape");
  static __host__ __device__ __forceinline__ int smem_offset(int tid) {
    const int r = tid >> 3, c = tid & 7;
    return r * D + ((c ^ (r & 7)) << 3);
  }
};

// Loads rows [0, ROWS) of a row-major global tile (row stride `ld` elements) into a swizzled
// [ROWS][D] smem tile; rows >= valid_rows are zero-filled.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16* smem, const bf16* gmem, int64_t ld, int valid_rows,
                                          int tid) {
  using C = TileCopy<ROWS, D, THREADS>;
  const int r0 = tid >> 3;
  bf16* s = smem + C::smem_offset(tid);
  const bf16* g = gmem + int64_t(r0) * ld + (tid & 7) * 8;
#pragma unroll
  for (int it = 0; it < ROWS / C::kRowStep; ++it) {
    const bool valid = r0 + it * C::kRowStep < valid_rows;
    const bf16* gr = valid ? g + int64_t(it * C::kRowStep) * ld : gmem;
#pragma unroll
    for (int seg = 0; seg < D / 64; ++seg)
      cp_async16(s + it * C::kRowStep * D + seg * 64, gr + (valid ? seg * 64 : 0), valid);
  }
}

// Stores a swizzled [ROWS][D] smem tile to global rows [0, valid_rows) with 16-byte stores.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void store_tile(bf16* gmem, int64_t ld, const bf16* smem, int valid_rows,
                                           int tid) {
  using C = TileCopy<ROWS, D, THREADS>;
  const int r0 = tid >> 3;
  const bf16* s = smem + C::smem_offset(tid);
  bf16* g = gmem + int64_t(r0) * ld + (tid & 7) * 8;
#pragma unroll
  for (int it = 0; it < ROWS / C::kRowStep; ++it) {
    if (r0 + it * C::kRowStep >= valid_rows) break;
#pragma unroll
    for (int seg = 0; seg < D / 64; ++seg)
      *reinterpret_cast<uint4*>(g + int64_t(it * C::kRowStep) * ld + seg * 64) =
          *reinterpret_cast<const uint4*>(s + it * C::kRowStep * D + seg * 64);
  }
}

// Loads keys/values [n0, n0 + BN) of one head (k, v: its row 0, row strides ldk, ldv) into one
// stage of the [BN][DQK] K and [BN][DV] V tiles; rows >= S are zero-filled.
template <int BN, int DQK, int DV, int THREADS>
__device__ __forceinline__ void load_kv_tiles(bf16* sK, bf16* sV, const bf16* k, const bf16* v,
                                              int64_t ldk, int64_t ldv, int n0, int S, int tid) {
  load_tile<BN, DQK, THREADS>(sK, k + int64_t(n0) * ldk, ldk, S - n0, tid);
  load_tile<BN, DV, THREADS>(sV, v + int64_t(n0) * ldv, ldv, S - n0, tid);
}

// One iteration's head of the two-stage cp.async pipeline the attention kernels run over their
// tiles (tile it of n lives in stage it & 1, tile 0 already issued and committed): unless tile it
// is the last, load_next(it + 1, stage) issues the next tile's copies into the other stage, which
// was last read in iteration it - 1 (ended by a barrier), and commits them; then the CTA waits for
// tile it and syncs. Returns tile it's stage.
template <typename LoadNext>
__device__ __forceinline__ int pipeline_next_stage(int it, int n, LoadNext&& load_next) {
  const int st = it & 1;
  if (it + 1 < n) {
    load_next(it + 1, st ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
  return st;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- fragment addresses -------------------------------------------------------------------------
// An ldmatrix.x4 reads four 8x8 matrices; each lane names one 16-byte row segment. For a fragment
// whose 16-column block is j (columns 16j..16j+15) the lane's segment is row R (with R % 8 ==
// lane % 8) and chunk 2j + y (y in {0, 1}). The lane's tile-relative offset for j = 0 is computed
// once; since rows are multiples of 128 bytes the swizzle then is one XOR on bits 5-6 plus adds,
// so addresses cost no registers per (j, row offset) pair.
template <int D>
__host__ __device__ __forceinline__ uint32_t frag_base(int row, int y) {
  return uint32_t(row * D * 2) + uint32_t((y ^ (row & 7)) << 4);
}
// Shared address of block j's segment, `rows` rows further down (rows % 8 == 0), in the tile whose
// shared address is `tile`.
template <int D>
__host__ __device__ __forceinline__ uint32_t frag_addr(uint32_t tile, uint32_t base, int j,
                                                       int rows) {
  return tile + (base ^ uint32_t((j & 3) << 5)) + uint32_t((j >> 2) * 128 + rows * D * 2);
}
// Lane offsets for the four operand patterns (see the PTX ISA's mma m16n8k16 fragment layouts):
// A from a tile stored [m][k]: frag_addr(tile, base, k0/16, m0) -> a0..a3 of block (m0, k0).
template <int D>
__host__ __device__ __forceinline__ uint32_t base_a(int lane) {
  return frag_base<D>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
}
// A from a tile stored [k][m], read with .trans: frag_addr(tile, base, m0/16, k0).
template <int D>
__host__ __device__ __forceinline__ uint32_t base_a_trans(int lane) {
  return frag_base<D>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
}
// B from a tile stored [n][k]: frag_addr(tile, base, k0/16, n0) -> {b0,b1} of n-tile n0 in
// r[0..1] and of n-tile n0+8 in r[2..3].
template <int D>
__host__ __device__ __forceinline__ uint32_t base_b(int lane) {
  return frag_base<D>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
}
// B from a tile stored [k][n], read with .trans: frag_addr(tile, base, n0/16, k0); same order.
template <int D>
__host__ __device__ __forceinline__ uint32_t base_b_trans(int lane) {
  return frag_base<D>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
}

// Two fp32 values -> one register of bf16x2, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Accumulator tiles (m16n8, fp32) j and j+1 -> the A fragment of the next product (m16k16): the
// C layout of two adjacent n8 tiles is the A layout of one k16 step.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Writes an m16n8 fp32 accumulator tile (rows r0.., cols c0..) as bf16 into a swizzled tile,
// scaling the lane's upper row (r0 + lane/4) by mul_lo and its lower row (+8) by mul_hi.
template <int D>
__device__ __forceinline__ void store_acc(bf16* tile, const float (&c)[4], int r0, int c0, int lane,
                                          float mul_lo, float mul_hi) {
  const int row = r0 + (lane >> 2), col = c0 + 2 * (lane & 3);
  *reinterpret_cast<uint32_t*>(tile + swz<D>(row, col)) = pack_bf16(c[0] * mul_lo, c[1] * mul_lo);
  *reinterpret_cast<uint32_t*>(tile + swz<D>(row + 8, col)) =
      pack_bf16(c[2] * mul_hi, c[3] * mul_hi);
}

// Raises a kernel's dynamic shared-memory limit once per device (host side; later calls only take
// a lock and test a bit). One instantiation per kernel, so the flag is the kernel's own.
template <auto Kernel>
void set_smem_limit_once(size_t bytes) {
  static std::mutex mu;
  static uint64_t done = 0;  // bit d: device d done
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (device < 64 && ((done >> device) & 1u)) return;
  CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  if (device < 64) done |= uint64_t(1) << device;
}

}  // namespace meshtrain::cuda::attn
