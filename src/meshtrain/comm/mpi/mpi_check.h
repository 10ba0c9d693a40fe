// MPI_CHECK: every MPI return in meshtrain goes through it. A failing call throws CommError
// naming the call, MPI's own error text and the world rank. It only sees errors on handles
// whose error handler is MPI_ERRORS_RETURN, which the Runtime and MpiCommunicator install.
#pragma once

#include <mpi.h>

namespace meshtrain::detail {
[[noreturn]] void throw_mpi_error(const char* call, int code, const char* file, int line);
}  // namespace meshtrain::detail

#define MPI_CHECK(call)                                                            \
  do {                                                                             \
    int mt_mpi_rc_ = (call);                                                       \
    if (mt_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                    \
      ::meshtrain::detail::throw_mpi_error(#call, mt_mpi_rc_, __FILE__, __LINE__); \
  } while (0)
