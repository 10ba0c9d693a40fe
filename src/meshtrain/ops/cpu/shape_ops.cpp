// CPU kernels for the structural copies. Copies move whole contiguous inner blocks with memcpy,
// so they work for every dtype; sum_dim adds the extent slices in order (deterministic).
#include "meshtrain/ops/shape_ops.h"

#include <cstring>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

using ops::DimSplit;
using ops::split_at;

// Copies rows of `len` blocks: dst block (o, dst_at + k) <- src block (o, src_at + k).
void copy_blocks(char* dst, int64_t dst_ext, int64_t dst_at, const char* src, int64_t src_ext,
                 int64_t src_at, int64_t outer, int64_t len, size_t block_bytes) {
  const size_t n = size_t(len) * block_bytes;
  if (n == 0) return;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + size_t(o * dst_ext + dst_at) * block_bytes,
                src + size_t(o * src_ext + src_at) * block_bytes, n);
}

size_t block_bytes(const Tensor& t, const DimSplit& s) {
  return size_t(s.inner) * dtype_size(t.dtype());
}

template <typename T>
void sum_dim_kernel(const T* x, T* y, const DimSplit& s) {
  for (int64_t o = 0; o < s.outer; ++o) {
    T* yo = y + o * s.inner;
    const T* xo = x + o * s.extent * s.inner;
    std::fill_n(yo, s.inner, T(0));
    for (int64_t k = 0; k < s.extent; ++k)
      for (int64_t j = 0; j < s.inner; ++j) yo[j] += xo[k * s.inner + j];
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("transpose01", [](KernelContext& c) {
    const Shape& x = c.in[0].shape();
    const int64_t P = x[0], Q = x[1];
    if (P * Q == 0) return;
    const size_t row = size_t(x.numel() / (P * Q)) * dtype_size(c.in[0].dtype());
    const char* src = static_cast<const char*>(c.in[0].raw());
    char* dst = static_cast<char*>(c.out[0].raw());
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        std::memcpy(dst + size_t(q * P + p) * row, src + size_t(p * Q + q) * row, row);
  });
  add_cpu_kernel("slice", [](KernelContext& c) {
    int dim = int(c.attrs().i("dim"));
    DimSplit in = split_at(c.in[0].shape(), dim);
    int64_t len = c.attrs().i("length");
    copy_blocks(static_cast<char*>(c.out[0].raw()), len, 0, static_cast<const char*>(c.in[0].raw()),
                in.extent, c.attrs().i("start"), in.outer, len, block_bytes(c.in[0], in));
  });
  add_cpu_kernel("slice_backward", [](KernelContext& c) {
    int dim = int(c.attrs().i("dim"));
    DimSplit in = split_at(c.in[0].shape(), dim);
    DimSplit out = split_at(c.out[0].shape(), dim);
    // All-zero bytes are 0 in every dtype; the copy then fills the sliced window.
    std::memset(c.out[0].raw(), 0, c.out[0].nbytes());
    copy_blocks(static_cast<char*>(c.out[0].raw()), out.extent, c.attrs().i("start"),
                static_cast<const char*>(c.in[0].raw()), in.extent, 0, in.outer, in.extent,
                block_bytes(c.in[0], in));
  });
  add_cpu_kernel(ops::kConcatOp, [](KernelContext& c) {
    int dim = int(c.attrs().i("dim"));
    DimSplit out = split_at(c.out[0].shape(), dim);
    int64_t at = 0;
    for (const Tensor& x : c.in) {
      DimSplit in = split_at(x.shape(), dim);
      copy_blocks(static_cast<char*>(c.out[0].raw()), out.extent, at,
                  static_cast<const char*>(x.raw()), in.extent, 0, in.outer, in.extent,
                  block_bytes(x, in));
      at += in.extent;
    }
  });
  add_cpu_kernel("expand", [](KernelContext& c) {
    int dim = int(c.attrs().i("dim"));
    DimSplit out = split_at(c.out[0].shape(), dim);
    const size_t bb = block_bytes(c.out[0], out);
    if (bb == 0) return;
    char* y = static_cast<char*>(c.out[0].raw());
    const char* x = static_cast<const char*>(c.in[0].raw());
    for (int64_t o = 0; o < out.outer; ++o)
      for (int64_t k = 0; k < out.extent; ++k)
        std::memcpy(y + size_t(o * out.extent + k) * bb, x + size_t(o) * bb, bb);
  });
  add_cpu_kernel("sum_dim", [](KernelContext& c) {
    DimSplit s = split_at(c.in[0].shape(), int(c.attrs().i("dim")));
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "sum_dim",
                      [&] { sum_dim_kernel(in_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 0), s); });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
