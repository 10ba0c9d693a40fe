// CPU reference kernels for the elementwise and structural ops (float32/float64; cast also
// converts to and from bfloat16 with round-to-nearest-even).
#include <algorithm>
#include <cstring>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
void add_kernel(const T* x, const T* y, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}
template <typename T>
void mul_kernel(const T* x, const T* y, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * y[i];
}
template <typename T>
void scale_kernel(const T* x, T* out, T f, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * f;
}
template <typename T>
void fill_kernel(T* out, T v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = v;
}

template <typename S, typename D>
void convert(const S* s, D* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, BFloat16>)
      d[i] = BFloat16(float(s[i]));
    else if constexpr (std::is_same_v<S, BFloat16>)
      d[i] = D(float(s[i]));
    else
      d[i] = D(s[i]);
  }
}

template <typename S>
void cast_from(const Tensor& src, const Tensor& dst) {
  const S* s = static_cast<const S*>(src.raw());
  int64_t n = src.numel();
  switch (dst.dtype()) {
    case DType::kF32: return convert(s, static_cast<float*>(dst.raw()), n);
    case DType::kF64: return convert(s, static_cast<double*>(dst.raw()), n);
    case DType::kBF16: return convert(s, static_cast<BFloat16*>(dst.raw()), n);
    case DType::kI32: return convert(s, static_cast<int32_t*>(dst.raw()), n);
    case DType::kI64: return convert(s, static_cast<int64_t*>(dst.raw()), n);
  }
}

void cast_kernel(const Tensor& src, const Tensor& dst) {
  switch (src.dtype()) {
    case DType::kF32: return cast_from<float>(src, dst);
    case DType::kF64: return cast_from<double>(src, dst);
    case DType::kBF16: return cast_from<BFloat16>(src, dst);
    case DType::kI32: return cast_from<int32_t>(src, dst);
    case DType::kI64: return cast_from<int64_t>(src, dst);
  }
}

void fill_any(const Tensor& out, double v) {
  int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::kF32: return fill_kernel(static_cast<float*>(out.raw()), float(v), n);
    case DType::kF64: return fill_kernel(static_cast<double*>(out.raw()), v, n);
    case DType::kBF16: return fill_kernel(static_cast<BFloat16*>(out.raw()), BFloat16(float(v)), n);
    case DType::kI32: return fill_kernel(static_cast<int32_t*>(out.raw()), int32_t(v), n);
    case DType::kI64: return fill_kernel(static_cast<int64_t*>(out.raw()), int64_t(v), n);
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("fill", [](KernelContext& c) { fill_any(c.out[0], c.attrs().f("value")); });
  add_cpu_kernel("add", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "add", [&] {
      add_kernel(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                 c.out[0].numel());
    });
  });
  add_cpu_kernel("mul", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "mul", [&] {
      mul_kernel(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                 c.out[0].numel());
    });
  });
  add_cpu_kernel("scale", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "scale", [&] {
      scale_kernel(in_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 0), scalar_t(c.attrs().f("factor")),
                   c.out[0].numel());
    });
  });
  add_cpu_kernel("cast", [](KernelContext& c) { cast_kernel(c.in[0], c.out[0]); });
  add_cpu_kernel("cast_into", [](KernelContext& c) { cast_kernel(c.in[1], c.in[0]); });
  add_cpu_kernel("reshape", [](KernelContext&) {});    // a view: shares its input's bytes
  add_cpu_kernel("grad_cast", [](KernelContext&) {});  // a view in forward
  add_cpu_kernel("sum", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "sum", [&] {
      const scalar_t* x = in_ptr<scalar_t>(c, 0);
      double acc = 0;
      for (int64_t i = 0, n = c.in[0].numel(); i < n; ++i) acc += double(x[i]);
      out_ptr<scalar_t>(c, 0)[0] = scalar_t(acc);
    });
  });
  add_cpu_kernel("expand_scalar", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "expand_scalar", [&] {
      fill_kernel(out_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 0)[0], c.out[0].numel());
    });
  });
  add_cpu_kernel("accumulate", [](KernelContext& c) {
    const Tensor& dst = c.in[0];
    const Tensor& src = c.in[1];
    const bool overwrite = c.attrs().b("overwrite");
    MT_DISPATCH_FLOAT(dst.dtype(), "accumulate", [&] {
      scalar_t* d = inout_ptr<scalar_t>(c, 0);
      int64_t n = dst.numel();
      if (overwrite) std::fill_n(d, n, scalar_t(0));  // then add: one code path, same values
      if (src.dtype() == dst.dtype()) {
        const scalar_t* s = in_ptr<scalar_t>(c, 1);
        for (int64_t i = 0; i < n; ++i) d[i] += s[i];
      } else if (src.dtype() == DType::kBF16) {
        const BFloat16* s = in_ptr<BFloat16>(c, 1);
        for (int64_t i = 0; i < n; ++i) d[i] += scalar_t(float(s[i]));
      } else {
        MT_DISPATCH_FLOAT(src.dtype(), "accumulate source", [&] {
          using src_t = scalar_t;
          const src_t* s = static_cast<const src_t*>(src.raw());
          for (int64_t i = 0; i < n; ++i) d[i] += decltype(d[0] + 0)(s[i]);
        });
      }
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
