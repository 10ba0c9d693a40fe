// Hopper (sm_90a) building blocks written from the PTX ISA: mbarriers, TMA tile copies (tensor maps
// encoded on the host through the driver entry point, so nothing links libcuda), wgmma with shared
// memory descriptors, setmaxnreg and named barriers. Rule: every shared-memory operand is a
// 128-byte swizzled tile ([rows][64] bf16 column blocks, 1024-byte aligned), the layout TMA writes.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda::hopper {

// ---- shared-memory layout
// ------------------------------------------------------------------------ A tile of R rows x D
// bf16 columns is stored as D/64 column blocks of [R][64] (128-byte rows). Inside a block, the
// 16-byte chunk c of row r sits at chunk position c ^ (r % 8): TMA's SWIZZLE_128B and wgmma's 128B
// swizzle mode both compute this from address bits [4:6] ^ [7:9], so a block must start on a
// 1024-byte boundary (8 rows x 128 bytes, one swizzle atom).
constexpr int kSwizzleBytes = 128;
constexpr int kBlockCols = 64;  // bf16 columns per 128-byte row

// Byte offset of element (r, c) of a swizzled tile with R rows (any c < D).
__host__ __device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c) {
  const int block = c / kBlockCols, cc = c % kBlockCols;
  return uint32_t(block * rows * kSwizzleBytes + r * kSwizzleBytes + (((cc >> 3) ^ (r & 7)) << 4) +
                  (cc & 7) * 2);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier
// ------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA completes on them).
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA traffic for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so a
// wait for parity 1 returns at once (producers start their "empty" waits that way).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- thread-block clusters
// --------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every non-exited thread of the cluster arrives, then waits for the others (release/acquire:
// shared-memory writes and barrier inits before it are visible to the cluster after it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
// One arrival on the barrier at the same shared-memory offset in cluster CTA `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// ---- TMA (cp.async.bulk.tensor)
// ------------------------------------------------------------------ Coordinates are innermost
// first, in elements; rows outside the tensor read as zero (loads) and are not written (stores).
// The tensor map is a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, uint32_t dst, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(const CUtensorMap* map, uint32_t dst, uint32_t bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// The same loads multicast: the box lands at `dst` in every CTA of the cluster named by `cta_mask`
// (bit r: cluster rank r), each completing `bytes` on its own barrier at offset `bar`.
__device__ __forceinline__ void tma_load_2d_multicast(const CUtensorMap* map, uint32_t dst,
                                                      uint32_t bar, int c0, int c1,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_multicast(const CUtensorMap* map, uint32_t dst,
                                                      uint32_t bar, int c0, int c1, int c2,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint32_t dst, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// The committed stores have read their shared memory (it may be reused or freed after this).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// The committed stores are complete (their global writes done): before a CTA that issued them
// exits.
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Four 8x8 bf16 matrices from registers into shared memory: lane l gives the address of row l % 8
// of matrix l / 8; register j holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j
// (the layout of a wgmma accumulator's 8-column chunk, packed to bf16 pairs).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
// Ordinary shared-memory stores become visible to the async proxy (TMA store, wgmma operands).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- warp specialisation
// -------------------------------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Named barriers (id 0 is __syncthreads): sync waits for `threads` arrivals including its own,
// arrive adds this warp's arrivals without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma
// ---------------------------------------------------------------------------------------
// Shared-memory matrix descriptor: start address >> 4 (bits 0-13), leading-dimension byte offset
// >> 4 (16-29), stride-dimension byte offset >> 4 (32-45), base offset 0 (49-51: every tile starts
// on a 1024-byte swizzle atom), swizzle mode 1 = 128B (62-63).
//   K-major operand (rows of M or N, K contiguous): LBO unused (1), SBO = 1024, the step between
//     8-row groups; the k16 step inside a 64-column block moves the start address by 32 bytes.
//   MN-major operand (rows of K, N contiguous; V in O += P V): SBO = 1024, the step between groups
//     of 8 K rows; LBO = the step between 64-column blocks of N (rows * 128 bytes).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                     uint32_t sbo_bytes) {
  uint64_t d = uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}
constexpr uint32_t kSw128Sbo = 1024;
constexpr uint32_t kKMajorLbo = 16;  // encodes as 1: "not used, assumed 1" for swizzled K-major

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of wgmma operand registers across this point
// (wgmma accesses them asynchronously between issue and wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define MT_WGMMA_D128                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define MT_WGMMA_ACC8(d, i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MT_WGMMA_ACC64_AT(d, i)                                                     \
  MT_WGMMA_ACC8(d, i), MT_WGMMA_ACC8(d, i + 8), MT_WGMMA_ACC8(d, i + 16),           \
      MT_WGMMA_ACC8(d, i + 24), MT_WGMMA_ACC8(d, i + 32), MT_WGMMA_ACC8(d, i + 40), \
      MT_WGMMA_ACC8(d, i + 48), MT_WGMMA_ACC8(d, i + 56)
#define MT_WGMMA_ACC64(d) MT_WGMMA_ACC64_AT(d, 0)

// d[64 x 128] (+)= A[64 x 16] * B[16 x 128], bf16 in, fp32 accumulate, both operands K-major in
// shared memory. `accumulate` 0 overwrites d. Accumulator layout (per warpgroup thread t, warp
// w = t / 32, lane l = t % 32): d[4j + e] is row 16w + l/4 + 8(e/2), column 8j + 2(l%4) + e%2.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MT_WGMMA_D128
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MT_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[64 x 128] (+)= A[64 x 16] * B[16 x 128] with A in registers (a[0..3] of this thread: rows
// 16w + l/4 (a0, a2) and +8 (a1, a3); columns 2(l%4) + {0,1} (a0, a1) and +8 (a2, a3); the lower
// column in the low half) and B MN-major in shared memory (imm-trans-b = 1).
__device__ __forceinline__ void wgmma_m64n128k16_rs_bt(float (&d)[64], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MT_WGMMA_D128
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : MT_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// d[64 x 128] = A[64 x K] B[128 x K]ᵀ, A and B K-major swizzled tiles (their 64-column blocks
// a_block / b_block bytes apart; a and b address the first row used). The k16 step ks reads block
// ks/4 at byte (ks%4)*32; the descriptor's address field takes the offset >> 4 directly.
template <int K>
__device__ __forceinline__ void wgmma_m64n128_kmajor(float (&d)[64], uint32_t a, uint32_t a_block,
                                                     uint32_t b, uint32_t b_block) {
  const uint64_t da = wgmma_desc_sw128(a, kKMajorLbo, kSw128Sbo);
  const uint64_t db = wgmma_desc_sw128(b, kKMajorLbo, kSw128Sbo);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint32_t ao = (ks / 4) * a_block + (ks % 4) * 32, bo = (ks / 4) * b_block + (ks % 4) * 32;
    wgmma_m64n128k16_ss(d, da + (ao >> 4), db + (bo >> 4), ks > 0);
  }
}

// d[64 x 128] += A[64 x K] B[K x 128], A in registers (a[4k..4k+3]: k16 step k, as acc_to_a_regs
// makes them), B MN-major: K rows of 128 bytes per 64-column block, the two blocks b_block bytes
// apart; the k16 step k starts 16 rows (2048 bytes) further.
template <int K>
__device__ __forceinline__ void wgmma_m64n128_regs_mnmajor(float (&d)[64],
                                                           const uint32_t (&a)[K / 4], uint32_t b,
                                                           uint32_t b_block) {
  const uint64_t db = wgmma_desc_sw128(b, b_block, kSw128Sbo);
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {
    const uint32_t ak[4] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
    wgmma_m64n128k16_rs_bt(d, ak, db + ((k * 16 * kSwizzleBytes) >> 4), 1);
  }
}

// d[64 x 64] (+)= A[64 x 16] * B[16 x 64] from shared-memory descriptors. kTransA / kTransB = 0:
// the operand is K-major; 1: MN-major (M or N contiguous; the descriptor's LBO is then the step
// between 64-element blocks, SBO = 1024 the step between 8-row groups of K). Accumulator layout as
// wgmma_m64n128k16_ss with j < 8.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
      ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d[64 x 192] (+)= A[64 x 16] (registers, as wgmma_m64n128k16_rs_bt) * B[16 x 192] MN-major.
__device__ __forceinline__ void wgmma_m64n192k16_rs_bt(float (&d)[96], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %101, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95}"
      ", {%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// d[64 x N] += A[64 x 16] * B[16 x N] from shared-memory descriptors (the grouped GEMM's mainloop),
// N = 128 or 256; kTransA / kTransB as wgmma_m64n64k16_ss (0: K-major, 1: MN-major). Always
// accumulates: the caller zeroes d.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss_acc(float (&d)[64], uint64_t desc_a,
                                                        uint64_t desc_b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %68, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MT_WGMMA_D128
      ", %64, %65, p, 1, 1, %66, %67;\n}\n"
      : MT_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB), "r"(1));
}
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16_ss_acc(float (&d)[128], uint64_t desc_a,
                                                        uint64_t desc_b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %132, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
      "%123, %124, %125, %126, %127}"
      ", %128, %129, p, 1, 1, %130, %131;\n}\n"
      : MT_WGMMA_ACC64_AT(d, 0), MT_WGMMA_ACC64_AT(d, 64)
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB), "r"(1));
}

#undef MT_WGMMA_D128
#undef MT_WGMMA_ACC8
#undef MT_WGMMA_ACC64
#undef MT_WGMMA_ACC64_AT

// Two fp32 values -> bf16x2, `lo` in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The accumulator of an m64nN product, columns 16k..16k+15, as the register A operand of the next
// product's k-step k: the accumulator pairs (4j..4j+3) of column chunks 2k and 2k+1 are exactly the
// (row, column) pairs of a0..a3.
template <int N>
__device__ __forceinline__ void acc_to_a_regs(uint32_t (&a)[N / 4], const float (&d)[N / 2]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) a[i] = pack_bf16x2(d[2 * i], d[2 * i + 1]);
}

// ---- host: tensor maps
// --------------------------------------------------------------------------- A bf16 tensor map
// of rank 2 to 4 (dims innermost first, strides in bytes for dims 1.., multiples of 16) whose box
// is box[0] = 64 columns (one 128-byte swizzled row) by box[1..]; 128-byte swizzling; out-of-range
// elements read as zero. Returns CUDA_SUCCESS, the driver's error, or CUDA_ERROR_NOT_FOUND when the
// driver has no cuTensorMapEncodeTiled.
inline CUresult encode_tensor_map_bf16(CUtensorMap* map, const void* base, uint32_t rank,
                                       const uint64_t* dims, const uint64_t* strides_bytes,
                                       const uint32_t* box) {
  using EncodeFn =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static EncodeFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<EncodeFn>(fn);
  }();
  if (!encode) return CUDA_ERROR_NOT_FOUND;
  if (rank < 2 || rank > 4) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t d[4] = {}, s[3] = {};
  cuuint32_t b[4] = {}, unit[4] = {1, 1, 1, 1};
  for (uint32_t i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), d, s, b, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
inline CUresult encode_tensor_map_bf16_4d(CUtensorMap* map, const void* base,
                                          const uint64_t dims[4], const uint64_t strides_bytes[3],
                                          const uint32_t box[4]) {
  return encode_tensor_map_bf16(map, base, 4, dims, strides_bytes, box);
}

}  // namespace meshtrain::cuda::hopper
