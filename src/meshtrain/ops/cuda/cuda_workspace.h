// Scratch sizes of the CUDA kernels: each kernel registers the size of the scratch it lays out
// (OpRegistry::add_kernel's workspace function) from the same numbers it uses. Sizes depend on
// shapes only, never on the device, so the memory plan is the same on every GPU and reductions
// are reproducible.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace meshtrain::cuda {

constexpr int kReduceThreads = 256;
constexpr size_t kWorkspaceAlign = 256;

inline size_t align_ws(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Deterministic two-pass reductions (sum, sum_squares, the cross-entropy loss): pass 1 runs this
// many blocks of kReduceThreads, each writing one float64 partial in a fixed order; pass 2 adds
// the partials in a fixed order. About 8 elements per thread per block, at most 1024 blocks.
inline int64_t reduce_blocks(int64_t n) {
  int64_t per_block = int64_t(kReduceThreads) * 8;
  return std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 1024);
}
inline size_t reduce_workspace_bytes(int64_t n) {
  return size_t(reduce_blocks(n)) * sizeof(double);
}

// rmsnorm_backward: 1/rms per row (float64), then per row-group column partials of dw (float64).
inline int64_t rmsnorm_row_groups(int64_t rows) {
  return std::clamp<int64_t>((rows + 31) / 32, 1, 128);
}
inline size_t rmsnorm_backward_rstd_bytes(int64_t rows) {
  return align_ws(size_t(rows) * sizeof(double));
}
inline size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t d) {
  return rmsnorm_backward_rstd_bytes(rows) +
         align_ws(size_t(rmsnorm_row_groups(rows)) * size_t(d) * sizeof(double));
}

// embedding_backward: a stable sort of (id, token) pairs, ping-ponged between two buffers of
// n int32 keys and n int32 values each, then where each of the V rows starts in the sorted
// order (V + 1 int32).
inline size_t embedding_backward_buffer_bytes(int64_t n) {
  return align_ws(size_t(n) * sizeof(int32_t));
}
inline size_t embedding_backward_workspace_bytes(int64_t n, int64_t v) {
  return 4 * embedding_backward_buffer_bytes(std::max<int64_t>(n, 1)) +
         align_ws(size_t(v + 1) * sizeof(int32_t));
}

// cross_entropy: one float64 loss per row, then the reduction partials over rows.
inline size_t cross_entropy_row_bytes(int64_t rows) {
  return align_ws(size_t(rows) * sizeof(double));
}
inline size_t cross_entropy_workspace_bytes(int64_t rows) {
  return cross_entropy_row_bytes(rows) + reduce_workspace_bytes(rows);
}

// Hopper attention backward (attention_bwd_bf16_sm90): delta = rowsum(dout * out), B*Hq*S fp32
// (the same as the mma.sync backward's), then, for the atomic-dQ variant only, the fp32 dQ
// accumulator [B, S, Hq, Dqk].
inline size_t attention_bwd_sm90_delta_bytes(int64_t batch, int64_t seq, int64_t heads_q) {
  return align_ws(size_t(batch * heads_q * seq) * sizeof(float));
}
inline size_t attention_bwd_sm90_workspace_bytes(int64_t batch, int64_t seq, int64_t heads_q,
                                                 int64_t dim_qk, bool atomic_dq) {
  return attention_bwd_sm90_delta_bytes(batch, seq, heads_q) +
         (atomic_dq ? align_ws(size_t(batch * seq * heads_q * dim_qk) * sizeof(float)) : 0);
}

}  // namespace meshtrain::cuda
