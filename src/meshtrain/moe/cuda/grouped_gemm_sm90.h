// meshtrain's Hopper grouped GEMM of the routed experts (grouped_gemm_sm90.cu): one persistent
// kernel per grouped GEMM that reads the groups ([2, E] int32: start row, count) from device
// memory, so no host wait and no per-expert launch. TMA loads into a multi-stage shared-memory
// ring on mbarriers, one producer warp, two consumer warpgroups issuing wgmma over a 128-row tile.
// Every function returns false (and launches nothing) where it cannot run: not compute capability
// 9.0, an extent whose row stride is not a multiple of 16 bytes, a base not 16-byte aligned, more
// than kMaxExperts experts; the caller then takes the per-expert cuBLASLt path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

inline constexpr int64_t kGroupedSm90MaxExperts = 1024;

// The tile variants, by the H100 run of bench_grouped_gemm on the DeepSeek 16B experts (bench/
// kernels/NOTES.md, 2026-12-07): 128x256 is the fastest forward and data gradient at 384 and
// 1,536 rows per expert and the fastest weight gradient at 1,536; at 384 the weight gradient
// (K = the expert's rows, short) is bound by its fp32 epilogue, which pingpong hides under the
// other warpgroup's MMAs (357 against 297 TFLOP/s).
enum GroupedSm90Variant : int {
  kGroupedSm90Wide = 0,         // 128x256 tiles, 4 stages, both consumer warpgroups on one tile
  kGroupedSm90Square = 1,       // 128x128 tiles, 6 stages
  kGroupedSm90Pingpong = 2,     // 128x128 tiles, 6 stages, each warpgroup on its own tile in turn
  kGroupedSm90WideCluster = 3,  // 128x256 in 2-CTA clusters sharing B (multicast), not yet timed
  kGroupedSm90Tall = 4,  // 256x128 tiles, 4 stages (1,408 columns in whole tiles), not yet timed
  kGroupedSm90TmaStore =
      5,  // 128x256, 3 stages, fwd/dgrad out by stmatrix + TMA store, not yet timed
  kGroupedSm90NumVariants = 6,
};
// The weight gradient's variant for a mean of `rows_per_expert` rows (K) per expert: pingpong up
// to this mean (measured at 384), 128x256 above (measured at 1,536).
inline constexpr int64_t kGroupedSm90PingpongMaxRowsPerExpert = 768;
inline int grouped_wgrad_sm90_variant_for(int64_t rows_per_expert) {
  return rows_per_expert <= kGroupedSm90PingpongMaxRowsPerExpert ? kGroupedSm90Pingpong
                                                                 : kGroupedSm90Wide;
}

// y[rows of e, n] = x[rows of e, k] · op(w_e) for every expert's group, bf16 with fp32
// accumulation; w [E, n, k] used transposed (transpose_w, the forward) or [E, k, n] (the data
// gradient). Rows outside every group are left untouched (the caller zeroes them). `rows`: x's and
// y's row count; groups outside [0, rows) are clipped to it.
struct GroupedGemmSm90 {
  const void* x;
  const void* w;
  void* y;
  const int32_t* groups;  // device [2, experts]
  int64_t experts, rows, n, k;
  bool transpose_w;
};
bool grouped_gemm_sm90(const GroupedGemmSm90& g, cudaStream_t stream,
                       int variant = kGroupedSm90Wide);

// out[e] [p, q] (=|+=) a[rows of e, p]ᵀ · b[rows of e, q], bf16 operands, fp32 accumulation;
// out float32 (accumulate: += ; else =) or bfloat16 (= only). Experts with no rows get zeros when
// not accumulating and are left alone when accumulating. The weight gradient of the above.
struct GroupedWgradSm90 {
  const void* a;
  const void* b;
  void* out;
  const int32_t* groups;  // device [2, experts]
  int64_t experts, rows, p, q;
  bool out_f32, accumulate;
};
bool grouped_wgrad_sm90(const GroupedWgradSm90& g, cudaStream_t stream,
                        int variant = kGroupedSm90Wide);

// The tile variants by number (bench_grouped_gemm times them all; the tests check them all).
int grouped_gemm_sm90_num_variants();
const char* grouped_gemm_sm90_variant_name(int variant);
// Whether this device and these extents can run (the same test the two functions make first).
bool grouped_gemm_sm90_supports(int64_t experts, int64_t n, int64_t k);

}  // namespace meshtrain::cuda
