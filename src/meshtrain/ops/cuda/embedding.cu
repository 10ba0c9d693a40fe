// CUDA embedding kernels. Forward: one block per token copies its weight row. Backward, with no
// float atomics: (1) one block stable-sorts the (id, token) pairs by id (LSD radix sort, 4 bits a
// pass, each thread owning a contiguous chunk, so ties keep token order); (2) a binary search per
// row finds where each row's run of tokens starts in that order; (3) one block per output row
// adds the dy rows of its tokens in token order (zero for rows no token uses). Same inputs, same
// bits, every run.
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/cuda_workspace.h"

namespace meshtrain::cuda {
namespace {

constexpr int kSortThreads = 512;
constexpr int kDigitBits = 4;
constexpr int kDigits = 1 << kDigitBits;

template <int V, typename T>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ ids, const T* __restrict__ w,
                                         T* __restrict__ y, int64_t v, int64_t d) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  MT_DEVICE_CHECK(id >= 0 && id < v, "embedding: a token id is outside [0, num_embeddings)");
  const Pack<T, V>* src = reinterpret_cast<const Pack<T, V>*>(w + int64_t(id) * d);
  Pack<T, V>* dst = reinterpret_cast<Pack<T, V>*>(y + t * d);
  for (int64_t j = threadIdx.x; j < d / V; j += blockDim.x) dst[j] = src[j];
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32, at most 1024); `total`
// receives the sum of all values.
__device__ int block_exclusive_scan(int v, int& total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int warps = int(blockDim.x >> 5);
    int s = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int up = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += up;
    }
    if (lane < warps) warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  total = warp_sums[(blockDim.x >> 5) - 1];
  const int warp_offset = warp == 0 ? 0 : warp_sums[warp - 1];
  return warp_offset + incl - v;
}

// Stable LSD radix sort of n keys (ids < 2^(4·passes)) with their token indices, by one block.
// Pass p reads (keys, vals) from the previous pass (pass 0: ids and the identity) and writes the
// other buffer pair. Thread t owns elements [t·chunk, (t+1)·chunk) in every pass; its per-digit
// counters sit in column t of hist[digit][thread], whose digit-major exclusive scan gives each
// (digit, thread) its first output slot. Requires n < 2^31.
__global__ void __launch_bounds__(kSortThreads)
    sort_ids_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t v, int passes,
                    // Not __restrict__: each pass reads what the previous one wrote through the
                    // same pointers (it must not take the read-only cache path).
                    int32_t* key_a, int32_t* val_a, int32_t* key_b, int32_t* val_b) {
  __shared__ int hist[kDigits * kSortThreads];
  const int tid = threadIdx.x;
  const int64_t chunk = (n + kSortThreads - 1) / kSortThreads;
  const int64_t begin = min(n, int64_t(tid) * chunk);
  const int64_t end = min(n, begin + chunk);
  const int32_t* src_k = ids;
  const int32_t* src_v = nullptr;
  int32_t* dst_k = key_a;
  int32_t* dst_v = val_a;
  for (int p = 0; p < passes; ++p) {
    const int shift = p * kDigitBits;
#pragma unroll
    for (int dg = 0; dg < kDigits; ++dg) hist[dg * kSortThreads + tid] = 0;
    for (int64_t i = begin; i < end; ++i) {
      const int32_t key = src_k[i];
      if (p == 0)
        MT_DEVICE_CHECK(key >= 0 && key < v,
                        "embedding_backward: a token id is outside [0, num_embeddings)");
      ++hist[((key >> shift) & (kDigits - 1)) * kSortThreads + tid];
    }
    __syncthreads();
    // Digit-major exclusive scan: thread t scans entries [t·16, t·16 + 16).
    int local[kDigits];
    int sum = 0;
#pragma unroll
    for (int k = 0; k < kDigits; ++k) {
      local[k] = hist[tid * kDigits + k];
      sum += local[k];
    }
    int total = 0;
    int run = block_exclusive_scan(sum, total);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kDigits; ++k) {
      hist[tid * kDigits + k] = run;
      run += local[k];
    }
    __syncthreads();
    for (int64_t i = begin; i < end; ++i) {
      const int32_t key = src_k[i];
      const int slot = hist[((key >> shift) & (kDigits - 1)) * kSortThreads + tid]++;
      dst_k[slot] = key;
      dst_v[slot] = src_v ? src_v[i] : int32_t(i);
    }
    // Global writes of this pass are visible to the whole block after the barrier.
    __syncthreads();
    src_k = dst_k;
    src_v = dst_v;
    dst_k = (p % 2 == 0) ? key_b : key_a;
    dst_v = (p % 2 == 0) ? val_b : val_a;
  }
}

__device__ int64_t first_at_least(const int32_t* __restrict__ keys, int64_t n, int32_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (keys[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// row_start[v] = the first sorted position whose id is >= v, for v in [0, V]: row v's tokens are
// sorted positions [row_start[v], row_start[v + 1]).
__global__ void row_starts_kernel(const int32_t* __restrict__ sorted_keys, int64_t n, int64_t v,
                                  int32_t* __restrict__ row_start) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r <= v; r += stride)
    row_start[r] = int32_t(first_at_least(sorted_keys, n, int32_t(r)));
}

// One block per output row: dw[row][j] = Σ over the row's tokens, in token order, of dy[token][j]
// (V-wide accesses; zero for rows no token uses).
template <int V, typename T>
__global__ void embedding_rows_kernel(const int32_t* __restrict__ row_start,
                                      const int32_t* __restrict__ sorted_tokens,
                                      const T* __restrict__ dy, T* __restrict__ dw, int64_t d) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x;
  const int64_t lo = row_start[row], hi = row_start[row + 1];
  Pack<T, V>* out = reinterpret_cast<Pack<T, V>*>(dw + row * d);
  for (int64_t j = threadIdx.x; j < d / V; j += blockDim.x) {
    A acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = A(0);
    for (int64_t s = lo; s < hi; ++s) {
      const Pack<T, V> g =
          reinterpret_cast<const Pack<T, V>*>(dy + int64_t(sorted_tokens[s]) * d)[j];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += to_acc(g.v[k]);
    }
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_acc<T>(acc[k]);
    out[j] = o;
  }
}

int sort_passes(int64_t v) {
  int bits = 0;
  while (bits < 31 && (int64_t(1) << bits) < v) ++bits;  // ids < v <= 2^bits
  return std::max(1, (bits + kDigitBits - 1) / kDigitBits);
}

template <typename T>
void forward(const int32_t* ids, const T* w, T* y, int64_t n, int64_t v, int64_t d,
             cudaStream_t s) {
  if (n == 0 || d == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  const bool vec = d % V == 0 && aligned16(w) && aligned16(y);
  const int threads = int(std::clamp<int64_t>(((vec ? d / V : d) + 31) / 32 * 32, 32, 256));
  if (vec)
    embedding_forward_kernel<V><<<unsigned(n), threads, 0, s>>>(ids, w, y, v, d);
  else
    embedding_forward_kernel<1><<<unsigned(n), threads, 0, s>>>(ids, w, y, v, d);
  CUDA_CHECK_LAUNCH("embedding_forward");
}

template <typename T>
void backward(const int32_t* ids, const T* dy, T* dw, void* ws, int64_t n, int64_t v, int64_t d,
              cudaStream_t s) {
  if (v == 0 || d == 0) return;
  MT_CHECK_T(ValueError, n < (int64_t(1) << 31),
             "embedding_backward (cuda): {} tokens exceed the "
             "int32 token indices of its sort",
             n);
  MT_CHECK_T(ValueError, v < (int64_t(1) << 31),
             "embedding_backward (cuda): num_embeddings {} exceeds int32", v);
  const size_t buf = embedding_backward_buffer_bytes(std::max<int64_t>(n, 1));
  char* base = static_cast<char*>(ws);
  int32_t* key_a = reinterpret_cast<int32_t*>(base);
  int32_t* val_a = reinterpret_cast<int32_t*>(base + buf);
  int32_t* key_b = reinterpret_cast<int32_t*>(base + 2 * buf);
  int32_t* val_b = reinterpret_cast<int32_t*>(base + 3 * buf);
  const int passes = sort_passes(v);
  if (n > 0) {
    sort_ids_kernel<<<1, kSortThreads, 0, s>>>(ids, n, v, passes, key_a, val_a, key_b, val_b);
    CUDA_CHECK_LAUNCH("embedding_backward_sort");
  }
  // Pass p writes buffer a when p is even: the last pass (passes - 1) decides.
  const bool in_a = (passes - 1) % 2 == 0;
  const int32_t* keys = in_a ? key_a : key_b;
  const int32_t* tokens = in_a ? val_a : val_b;
  int32_t* row_start = reinterpret_cast<int32_t*>(base + 4 * buf);
  row_starts_kernel<<<grid_for(v + 1, 256), 256, 0, s>>>(keys, n, v, row_start);
  CUDA_CHECK_LAUNCH("embedding_backward_row_starts");
  constexpr int V = 16 / int(sizeof(T));
  const bool vec = d % V == 0 && aligned16(dy) && aligned16(dw);
  const int threads = int(std::clamp<int64_t>(((vec ? d / V : d) + 31) / 32 * 32, 32, 256));
  if (vec)
    embedding_rows_kernel<V><<<unsigned(v), threads, 0, s>>>(row_start, tokens, dy, dw, d);
  else
    embedding_rows_kernel<1><<<unsigned(v), threads, 0, s>>>(row_start, tokens, dy, dw, d);
  CUDA_CHECK_LAUNCH("embedding_backward_rows");
}

MT_REGISTER_OPS {
  add_cuda_kernel("embedding", [](KernelContext& c) {
    const Shape& ws = c.in[1].shape();
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "embedding", [&] {
      forward(in_ptr<int32_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
              c.in[0].numel(), ws[0], ws[1], stream_of(c));
    });
  });
  // Scratch: the buffers of a stable sort of the ids (no float atomics in dweight).
  add_cuda_kernel(
      "embedding_backward",
      [](KernelContext& c) {
        const Shape& os = c.out[0].shape();
        MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "embedding_backward", [&] {
          backward(in_ptr<int32_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                   c.workspace.raw(), c.in[0].numel(), os[0], os[1], stream_of(c));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out, const Attrs&) {
        return embedding_backward_workspace_bytes(in[0].numel(), out[0].shape[0]);
      });
}

}  // namespace
}  // namespace meshtrain::cuda
