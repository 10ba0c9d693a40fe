// Formats a failed MPI call as a CommError: the call text, MPI's error class and string, and
// the world rank (queried from MPI itself so the message is right even before set_error_rank).
#include "meshtrain/comm/mpi/mpi_check.h"

#include <string>

#include "meshtrain/core/check.h"

namespace meshtrain::detail {

void throw_mpi_error(const char* call, int code, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  std::string what(text, size_t(len));
  int cls = code;
  MPI_Error_class(code, &cls);

  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string where = rank >= 0 ? fmt::format("on world rank {}", rank) : "before MPI_Init";
  throw CommError(fmt::format("{} failed {}: MPI error class {} ({})", call, where, cls,
                              what.empty() ? "no description" : what),
                  file, line);
}

}  // namespace meshtrain::detail
