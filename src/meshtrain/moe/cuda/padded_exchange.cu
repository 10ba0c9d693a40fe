// CUDA kernels of the padded expert exchange (moe/padded_exchange.h): the index maps (one thread
// per destination row, the rules shared with the CPU kernels), the row gather (one block per row,
// 16-byte moves where the rows allow) and the overflow count (one thread: the counts are
// [ep, E_local], a few hundred integers). No host wait anywhere.
#include "meshtrain/moe/padded_exchange.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

using ops::EpPaddedShape;
using ops::EpRowMap;

__global__ void index_kernel(EpRowMap map, EpPaddedShape s, const int32_t* groups,
                             const int32_t* recv, int32_t* idx, int64_t rows) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < rows;
       d += int64_t(gridDim.x) * blockDim.x)
    idx[d] = int32_t(ops::ep_padded_source(map, s, groups, recv, d));
}

template <typename W>
__global__ void gather_kernel(W* dst, const W* src, const int32_t* idx, int64_t words) {
  const int64_t d = blockIdx.x;
  const int32_t from = idx[d];
  W* out = dst + d * words;
  if (from < 0) {
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) out[i] = W{};
    return;
  }
  const W* in = src + int64_t(from) * words;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) out[i] = in[i];
}

__global__ void overflow_kernel(EpPaddedShape s, const int32_t* groups, const int32_t* recv,
                                float* counter) {
  *counter += float(ops::ep_padded_overflows(s, groups, recv));
}

void cuda_index(EpRowMap map, const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
                int32_t* idx, Stream& stream) {
  const int64_t rows = ops::ep_padded_rows(map, s);
  if (rows == 0) return;
  index_kernel<<<grid_for(rows, 256), 256, 0, native_stream(stream)>>>(map, s, groups, recv, idx,
                                                                       rows);
  CUDA_CHECK(cudaGetLastError());
}

void cuda_gather(void* dst, const void* src, const int32_t* idx, int64_t rows, size_t row_bytes,
                 Stream& stream) {
  if (rows == 0 || row_bytes == 0) return;
  cudaStream_t st = native_stream(stream);
  const auto grid = unsigned(rows);
  if (row_bytes % 16 == 0 && aligned16(dst) && aligned16(src)) {
    const int64_t words = int64_t(row_bytes / 16);
    gather_kernel<<<grid, unsigned(std::min<int64_t>(256, words)), 0, st>>>(
        static_cast<uint4*>(dst), static_cast<const uint4*>(src), idx, words);
  } else if (row_bytes % 4 == 0) {
    const int64_t words = int64_t(row_bytes / 4);
    gather_kernel<<<grid, unsigned(std::min<int64_t>(256, words)), 0, st>>>(
        static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), idx, words);
  } else {
    const int64_t words = int64_t(row_bytes);
    gather_kernel<<<grid, unsigned(std::min<int64_t>(256, words)), 0, st>>>(
        static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), idx, words);
  }
  CUDA_CHECK(cudaGetLastError());
}

void cuda_count_overflows(const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
                          float* counter, Stream& stream) {
  overflow_kernel<<<1, 1, 0, native_stream(stream)>>>(s, groups, recv, counter);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

MT_REGISTER_OPS {
  ops::register_ep_padded_kernels(
      DeviceType::kCUDA,
      {.index = cuda_index, .gather = cuda_gather, .count_overflows = cuda_count_overflows});
}

}  // namespace meshtrain::cuda
