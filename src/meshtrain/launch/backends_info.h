// The backends this build carries, for `meshtrain --version`: CPU always; CUDA with the
// architectures it was compiled for, NCCL and cuDNN when CUDA is built; the MPI library.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

// One line per backend, e.g. "CUDA 12.4 runtime, architectures 90a", "NCCL 2.21.5",
// "MPI: Open MPI v4.1.4 (MPI 3.1)". Callable before MPI is initialised.
std::vector<std::string> built_in_backends();

}  // namespace meshtrain
