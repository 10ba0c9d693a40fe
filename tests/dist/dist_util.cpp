// Dtype-generic element access and cross-rank comparisons for the MPI tests.
#include "dist_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace dist {

using meshtrain::BFloat16;
using meshtrain::DType;
using meshtrain::Tensor;

void set_elem(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = float(v); break;
    case DType::kF64: t.data<double>()[i] = v; break;
    case DType::kBF16: t.data<BFloat16>()[i] = BFloat16(float(v)); break;
    case DType::kI32: t.data<int32_t>()[i] = int32_t(v); break;
    case DType::kI64: t.data<int64_t>()[i] = int64_t(v); break;
  }
}

double get_elem(const Tensor& t, int64_t i) { return t.item_as_double(i); }

Tensor filled(const meshtrain::Shape& shape, DType dtype, const std::function<double(int64_t)>& f) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) set_elem(t, i, f(i));
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  if (!b.empty()) std::memcpy(b.data(), t.raw(), b.size());
  return b;
}

bool same_bytes_on_all_ranks(meshtrain::Communicator& comm, const Tensor& t) {
  // Gather the tensor itself (every dtype moves bit-exactly), then compare raw bytes.
  Tensor all = Tensor::empty(meshtrain::Shape{comm.size() * t.numel()}, t.dtype());
  comm.all_gather(t.view(meshtrain::Shape{t.numel()}), all, stream());
  const uint8_t* a = static_cast<const uint8_t*>(all.raw());
  for (int p = 0; p < comm.size(); ++p)
    if (t.nbytes() && std::memcmp(a + size_t(p) * t.nbytes(), t.raw(), t.nbytes()) != 0)
      return false;
  return true;
}

std::vector<int> members(meshtrain::Communicator& comm) {
  Tensor mine = Tensor::from_vector<int32_t>({rank()}, meshtrain::Shape{1});
  Tensor all = Tensor::empty(meshtrain::Shape{comm.size()}, DType::kI32);
  comm.all_gather(mine, all, stream());
  auto v = all.to_vector<int32_t>();
  return std::vector<int>(v.begin(), v.end());
}

}  // namespace dist

namespace dist {
void expect_elems(int64_t n, const std::function<double(int64_t)>& got,
                  const std::function<double(int64_t)>& want, const std::string& what, double tol) {
  for (int64_t i = 0; i < n; ++i) {
    double g = got(i), w = want(i);
    bool ok = tol == 0.0 ? g == w : std::abs(g - w) <= tol;
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w
                    << (tol > 0 ? " (tolerance " + std::to_string(tol) + ")" : "");
      return;
    }
  }
}
}  // namespace dist
