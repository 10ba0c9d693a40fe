// Helpers for the MPI test program: the Runtime and world communicator every test shares, a CPU
// stream, and dtype-generic element access so one test body covers every dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

namespace dist {

meshtrain::Runtime& runtime();
meshtrain::Communicator& world();
meshtrain::Stream& stream();
inline int rank() { return world().rank(); }
inline int nranks() { return world().size(); }

inline const std::vector<meshtrain::DType>& all_dtypes() {
  static const std::vector<meshtrain::DType> v{meshtrain::DType::kF32, meshtrain::DType::kF64,
                                               meshtrain::DType::kBF16, meshtrain::DType::kI32,
                                               meshtrain::DType::kI64};
  return v;
}

// Element i of a host tensor of any dtype, through double (exact for the values tests use).
void set_elem(const meshtrain::Tensor& t, int64_t i, double v);
double get_elem(const meshtrain::Tensor& t, int64_t i);
meshtrain::Tensor filled(const meshtrain::Shape& shape, meshtrain::DType dtype,
                         const std::function<double(int64_t)>& f);
std::vector<uint8_t> bytes_of(const meshtrain::Tensor& t);
// True when every rank of `comm` holds exactly these bytes (gathered and compared bitwise).
bool same_bytes_on_all_ranks(meshtrain::Communicator& comm, const meshtrain::Tensor& t);
// World ranks of the members of `comm`, in its rank order.
std::vector<int> members(meshtrain::Communicator& comm);

// A seed every rank agrees on, fresh each run (rank 0's clock, broadcast).
uint64_t shared_fresh_seed();

}  // namespace dist

namespace dist {
// Checks got(i) against want(i) (within tol) for i < n and reports only the first mismatch.
// Never returns early from the calling test: an ASSERT that skipped this rank's next
// collective would leave its peers waiting.
void expect_elems(int64_t n, const std::function<double(int64_t)>& got,
                  const std::function<double(int64_t)>& want, const std::string& what,
                  double tol = 0.0);
}  // namespace dist
