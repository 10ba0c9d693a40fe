// Single-instruction probes of ops/cuda/hopper_mma.cuh on the GPU (hopper_selfcheck.cu), so a
// failing Hopper attention test can be traced to one layer: the K-major wgmma with both operands
// from shared memory, the register-A wgmma with an MN-major B, the backward's m64n64 (either
// operand MN-major) and m64n192 shapes, or a TMA load/store round trip.
// Host buffers in, host buffers out; bf16 values travel as their 16-bit patterns.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain::cudatest::hopper {

// C[64 x 128] = A[64 x K] · B[128 x K]ᵀ for K = 192 (three 64-column blocks, twelve k16 steps):
// A and B row-major bf16, stored into swizzled shared memory by plain stores, multiplied by
// wgmma_m64n128_kmajor<192>; C as the m64n128 accumulator layout says it is.
constexpr int kSsK = 192;
std::vector<float> wgmma_kmajor(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b);

// C[64 x 128] = P[64 x 128] · V[128 x 128]: P (fp32, row-major) enters the registers in the m64n128
// accumulator layout and goes through acc_to_a_regs (bf16), V (row-major [k][n]) sits MN-major in
// shared memory; wgmma_m64n128_regs_mnmajor<128>. `swap_strides` builds the descriptor with LBO
// and SBO exchanged instead (a diagnosis: if only that matches, the descriptor fields are swapped).
std::vector<float> wgmma_regs_mnmajor(const std::vector<float>& p, const std::vector<uint16_t>& v,
                                      bool swap_strides);

// The backward's shapes. C[64 x 64] = A[64 x K] · B[64 x K]ᵀ for K = 128 by
// wgmma_m64n64k16_ss<trans_a, trans_b>: A and B row-major bf16 in, each stored K-major (as the
// score products read Q, K, dO, V) or, when trans, MN-major ([K][64], as the atomic dQ reads dSᵀ
// and K).
constexpr int kN64K = 128;
std::vector<float> wgmma_m64n64(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                bool trans_a, bool trans_b);
// C[64 x 192] = P[64 x 64] · B[64 x 192]: P (fp32 row-major) through the m64n64 accumulator layout
// and acc_to_a_regs<64>, B (row-major [k][n]) MN-major in three 64-column blocks; as dK += dSᵀ Q
// at Dqk 192 (wgmma_m64n192k16_rs_bt).
std::vector<float> wgmma_regs_n192(const std::vector<float>& p, const std::vector<uint16_t>& b);

// TMA: a tensor [batch][seq][heads][128] bf16 (`src`), the box of 64 columns x `rows` rows at
// (col0, head, row0, b) loaded into 1024-aligned shared memory; `smem` receives that memory as
// raw 16-bit words (rows * 64, still swizzled), and the same box is stored back into `dst` (same
// extents, initially `dst_init`) at (col0, head, dst_row0, b).
struct TmaProbe {
  int batch, seq, heads, rows, col0, head, row0, b, dst_row0;
};
void tma_round_trip(const TmaProbe& t, const std::vector<uint16_t>& src,
                    const std::vector<uint16_t>& dst_init, std::vector<uint16_t>& smem,
                    std::vector<uint16_t>& dst);

}  // namespace meshtrain::cudatest::hopper
