// built_in_backends: compile-time versions of CUDA/NCCL (in CUDA builds) and the MPI library's
// own version string (MPI_Get_library_version may be called before MPI_Init).
#include "meshtrain/launch/backends_info.h"

#include <fmt/format.h>
#include <mpi.h>

#ifdef MESHTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace meshtrain {

std::vector<std::string> built_in_backends() {
  std::vector<std::string> out{"CPU (reference kernels, OpenBLAS GEMMs)"};
#ifdef MESHTRAIN_WITH_CUDA
  out.push_back(fmt::format("CUDA {}.{} runtime, architectures {}", CUDART_VERSION / 1000,
                            (CUDART_VERSION % 1000) / 10, MESHTRAIN_CUDA_ARCHITECTURES));
  out.push_back(fmt::format("NCCL {}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
#else
  out.push_back("CUDA: not built (configure with nvcc on the PATH)");
#endif
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string lib(mpi, size_t(len));
  // Open MPI's string runs on with its repository and release date: keep the first clause.
  if (size_t cut = lib.find_first_of(",\n"); cut != std::string::npos) lib.resize(cut);
  out.push_back(fmt::format("MPI: {} (MPI {}.{})", lib, MPI_VERSION, MPI_SUBVERSION));
  return out;
}

}  // namespace meshtrain
