// CPU rope kernels. rope_table resolves its frequencies once when the executor prepares the
// graph (host work outside the step), then writes cos/sin of t * f_i in float64 each run.
#include "meshtrain/ops/rope.h"

#include <cmath>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
void write_table(const std::vector<double>& freqs, T* table, int64_t seq_len) {
  const int64_t half = int64_t(freqs.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    T* row = table + t * half * 2;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(t) * freqs[size_t(i)];
      row[2 * i] = T(std::cos(angle));
      row[2 * i + 1] = T(std::sin(angle));
    }
  }
}

// (x0 + i x1) * (cos + i sin), with sin negated for the inverse rotation, on columns
// [start, start + 2 half) of each row of d; the other columns are copied.
template <typename T>
void rope_kernel(const T* x, const T* table, T* y, int64_t b, int64_t s, int64_t h, int64_t d,
                 int64_t start, bool inverse) {
  const int64_t half = (d - start) / 2;
  const T sign = inverse ? T(-1) : T(1);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si) {
      const T* cs = table + si * half * 2;
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t off = ((bi * s + si) * h + hi) * d;
        const T* xr = x + off;
        T* yr = y + off;
        for (int64_t j = 0; j < start; ++j) yr[j] = xr[j];
        xr += start;
        yr += start;
        for (int64_t i = 0; i < half; ++i) {
          const T c = cs[2 * i], sn = sign * cs[2 * i + 1];
          const T x0 = xr[2 * i], x1 = xr[2 * i + 1];
          yr[2 * i] = x0 * c - x1 * sn;
          yr[2 * i + 1] = x0 * sn + x1 * c;
        }
      }
    }
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory(
      "rope_table", DeviceType::kCPU, [](const Node& node, const Graph&) -> KernelFn {
        const Attrs& a = node.attrs;
        std::vector<double> freqs =
            ops::rope_frequencies(ops::rope_config_from_attrs(a), a.i("rot_dim"), a.i("seq_len"));
        return [freqs = std::move(freqs)](KernelContext& c) {
          MT_DISPATCH_FLOAT(c.out[0].dtype(), "rope_table", [&] {
            write_table(freqs, out_ptr<scalar_t>(c, 0), c.out[0].shape()[0]);
          });
        };
      });
  add_cpu_kernel("rope", [](KernelContext& c) {
    const Shape& s = c.in[0].shape();
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "rope", [&] {
      rope_kernel(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0), s[0],
                  s[1], s[2], s[3], c.attrs().i("start", 0), c.attrs().b("inverse"));
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
