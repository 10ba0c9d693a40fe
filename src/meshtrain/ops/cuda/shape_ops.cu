// CUDA kernels for the structural copies (slice, slice_backward, concat, expand) and sum_dim.
// Copies move whole inner blocks as raw words of the widest size (16, 8, 4, 2 or 1 bytes) that
// divides the block and aligns both pointers, so they work for every dtype; sum_dim gives each
// output element one thread that adds the extent slices in order (deterministic).
#include <algorithm>

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain::cuda {
namespace {

using ops::DimSplit;
using ops::split_at;

// dst word (o, dst_at·w + r) <- src word (o, src_at·w + r) for r < len·w, where w = words per
// block: row o of dst has dst_ext blocks, row o of src has src_ext blocks. I is the index type:
// 32-bit when every word index fits (the division per element then costs a fraction of 64-bit's).
template <typename U, typename I>
__global__ void copy_blocks_kernel(U* __restrict__ dst, I dst_ext, I dst_at,
                                   const U* __restrict__ src, I src_ext, I src_at, I outer, I len,
                                   I words) {
  const I row = len * words;
  const I n = outer * row;
  const I stride = I(gridDim.x) * blockDim.x;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const I o = i / row, r = i - o * row;
    dst[(o * dst_ext + dst_at) * words + r] = src[(o * src_ext + src_at) * words + r];
  }
}

// y (o, k, ·) <- x (o, ·) for k < n: repeats each inner block n times.
template <typename U>
__global__ void expand_kernel(U* __restrict__ y, const U* __restrict__ x, int64_t outer,
                              int64_t n_rep, int64_t words) {
  const int64_t row = n_rep * words;
  const int64_t total = outer * row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t o = i / row, w = (i - o * row) % words;
    y[i] = x[o * words + w];
  }
}

template <typename T>
__global__ void sum_dim_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                               int64_t extent, int64_t inner) {
  const int64_t n = outer * inner;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t o = i / inner, j = i - o * inner;
    const T* xo = x + o * extent * inner + j;
    acc_t<T> acc = 0;
    for (int64_t k = 0; k < extent; ++k) acc += to_acc(xo[k * inner]);
    y[i] = from_acc<T>(acc);
  }
}

// The widest word that divides `block_bytes` and keeps both base pointers aligned.
int word_bytes(size_t block_bytes, const void* a, const void* b) {
  const uintptr_t bits =
      reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | block_bytes;
  for (int w : {16, 8, 4, 2})
    if ((bits & uintptr_t(w - 1)) == 0) return w;
  return 1;
}

template <typename U>
void launch_copy_blocks(void* dst, int64_t dst_ext, int64_t dst_at, const void* src,
                        int64_t src_ext, int64_t src_at, int64_t outer, int64_t len, int64_t words,
                        cudaStream_t s) {
  const unsigned grid = grid_for(outer * len * words, 256);
  U* d = static_cast<U*>(dst);
  const U* x = static_cast<const U*>(src);
  // Largest word index touched on either side (plus the grid-stride overshoot) must fit 32 bits.
  const int64_t span = std::max(outer * dst_ext, outer * src_ext) * words + int64_t(grid) * 256;
  if (span < (int64_t(1) << 32))
    copy_blocks_kernel<U, uint32_t>
        <<<grid, 256, 0, s>>>(d, uint32_t(dst_ext), uint32_t(dst_at), x, uint32_t(src_ext),
                              uint32_t(src_at), uint32_t(outer), uint32_t(len), uint32_t(words));
  else
    copy_blocks_kernel<U, int64_t>
        <<<grid, 256, 0, s>>>(d, dst_ext, dst_at, x, src_ext, src_at, outer, len, words);
}

void copy_blocks(void* dst, int64_t dst_ext, int64_t dst_at, const void* src, int64_t src_ext,
                 int64_t src_at, int64_t outer, int64_t len, size_t block_bytes, cudaStream_t s) {
  if (outer == 0 || len == 0 || block_bytes == 0) return;
  const int w = word_bytes(block_bytes, dst, src);
  const int64_t words = int64_t(block_bytes) / w;
  switch (w) {
    case 16:
      launch_copy_blocks<uint4>(dst, dst_ext, dst_at, src, src_ext, src_at, outer, len, words, s);
      break;
    case 8:
      launch_copy_blocks<uint64_t>(dst, dst_ext, dst_at, src, src_ext, src_at, outer, len, words,
                                   s);
      break;
    case 4:
      launch_copy_blocks<uint32_t>(dst, dst_ext, dst_at, src, src_ext, src_at, outer, len, words,
                                   s);
      break;
    case 2:
      launch_copy_blocks<uint16_t>(dst, dst_ext, dst_at, src, src_ext, src_at, outer, len, words,
                                   s);
      break;
    default:
      launch_copy_blocks<uint8_t>(dst, dst_ext, dst_at, src, src_ext, src_at, outer, len, words, s);
  }
  CUDA_CHECK_LAUNCH("copy_blocks");
}

template <typename U>
void launch_expand(void* y, const void* x, int64_t outer, int64_t n, int64_t words,
                   cudaStream_t s) {
  expand_kernel<<<grid_for(outer * n * words, 256), 256, 0, s>>>(
      static_cast<U*>(y), static_cast<const U*>(x), outer, n, words);
}

void expand(void* y, const void* x, int64_t outer, int64_t n, size_t block_bytes, cudaStream_t s) {
  if (outer == 0 || n == 0 || block_bytes == 0) return;
  const int w = word_bytes(block_bytes, y, x);
  const int64_t words = int64_t(block_bytes) / w;
  switch (w) {
    case 16: launch_expand<uint4>(y, x, outer, n, words, s); break;
    case 8: launch_expand<uint64_t>(y, x, outer, n, words, s); break;
    case 4: launch_expand<uint32_t>(y, x, outer, n, words, s); break;
    case 2: launch_expand<uint16_t>(y, x, outer, n, words, s); break;
    default: launch_expand<uint8_t>(y, x, outer, n, words, s);
  }
  CUDA_CHECK_LAUNCH("expand");
}

size_t block_bytes(const Tensor& t, const DimSplit& s) {
  return size_t(s.inner) * dtype_size(t.dtype());
}

MT_REGISTER_OPS {
  add_cuda_kernel("transpose01", [](KernelContext& c) {
    const Shape& x = c.in[0].shape();
    const int64_t P = x[0], Q = x[1];
    if (P * Q == 0) return;
    const size_t row = size_t(x.numel() / (P * Q)) * dtype_size(c.in[0].dtype());
    // One strided copy per source block p: its Q rows land P rows apart.
    for (int64_t p = 0; p < P; ++p)
      CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(c.out[0].raw()) + size_t(p) * row,
                                   size_t(P) * row,
                                   static_cast<const char*>(c.in[0].raw()) + size_t(p * Q) * row,
                                   row, row, size_t(Q), cudaMemcpyDeviceToDevice, stream_of(c)));
  });
  add_cuda_kernel("slice", [](KernelContext& c) {
    const int dim = int(c.attrs().i("dim"));
    const DimSplit in = split_at(c.in[0].shape(), dim);
    const int64_t len = c.attrs().i("length");
    copy_blocks(c.out[0].raw(), len, 0, c.in[0].raw(), in.extent, c.attrs().i("start"), in.outer,
                len, block_bytes(c.in[0], in), stream_of(c));
  });
  add_cuda_kernel("slice_backward", [](KernelContext& c) {
    const int dim = int(c.attrs().i("dim"));
    const DimSplit in = split_at(c.in[0].shape(), dim);
    const DimSplit out = split_at(c.out[0].shape(), dim);
    // All-zero bytes are 0 in every dtype; the copy then fills the window (same stream: ordered).
    if (c.out[0].nbytes() > 0)
      CUDA_CHECK(cudaMemsetAsync(c.out[0].raw(), 0, c.out[0].nbytes(), stream_of(c)));
    copy_blocks(c.out[0].raw(), out.extent, c.attrs().i("start"), c.in[0].raw(), in.extent, 0,
                in.outer, in.extent, block_bytes(c.in[0], in), stream_of(c));
  });
  add_cuda_kernel(ops::kConcatOp, [](KernelContext& c) {
    const int dim = int(c.attrs().i("dim"));
    const DimSplit out = split_at(c.out[0].shape(), dim);
    int64_t at = 0;
    for (const Tensor& x : c.in) {
      const DimSplit in = split_at(x.shape(), dim);
      copy_blocks(c.out[0].raw(), out.extent, at, x.raw(), in.extent, 0, in.outer, in.extent,
                  block_bytes(x, in), stream_of(c));
      at += in.extent;
    }
  });
  add_cuda_kernel("expand", [](KernelContext& c) {
    const DimSplit out = split_at(c.out[0].shape(), int(c.attrs().i("dim")));
    expand(c.out[0].raw(), c.in[0].raw(), out.outer, out.extent, block_bytes(c.out[0], out),
           stream_of(c));
  });
  add_cuda_kernel("sum_dim", [](KernelContext& c) {
    const DimSplit s = split_at(c.in[0].shape(), int(c.attrs().i("dim")));
    const int64_t n = s.outer * s.inner;
    if (n == 0) return;
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "sum_dim", [&] {
      sum_dim_kernel<<<grid_for(n, 256), 256, 0, stream_of(c)>>>(
          in_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 0), s.outer, s.extent, s.inner);
      CUDA_CHECK_LAUNCH("sum_dim");
    });
  });
}

}  // namespace
}  // namespace meshtrain::cuda
