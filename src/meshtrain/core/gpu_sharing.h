// Several ranks on one GPU, a test setup: the MESHTRAIN_SHARE_GPU switch (set by `meshtrain train
// --share-gpu`), the NCCL environment each rank sets before NCCL starts, and the GPU a rank takes.
// Rule: a variable the user already set is never overwritten.
//
// NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"). With its own
// NCCL_HOSTID every rank is a node of its own, and NCCL connects the "nodes" with its socket
// transport over loopback (P2P, SHM, IB and NVLS off): results are exact, speed is not
// representative.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

// Returns the variable's value or nullptr; tests pass a fake environment.
using EnvLookup = std::function<const char*(const char*)>;

inline constexpr const char* kShareGpuVar = "MESHTRAIN_SHARE_GPU";

// True when MESHTRAIN_SHARE_GPU is 1/true/yes/on; false when unset, empty or 0/false/no/off;
// ConfigError for any other value.
bool share_gpu_requested(const EnvLookup& env);
bool share_gpu_requested();  // from the process environment

// The NCCL variables a rank sets in shared mode, minus those `env` already has: NCCL_HOSTID
// ("meshtrain-share-<rank>"), NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo, NCCL_P2P_DISABLE=1,
// NCCL_SHM_DISABLE=1, NCCL_IB_DISABLE=1, NCCL_NVLS_ENABLE=0.
std::vector<std::pair<std::string, std::string>> share_gpu_nccl_env(int rank, const EnvLookup& env);
// Sets share_gpu_nccl_env(rank, process environment) with setenv. Call before NCCL starts.
void apply_share_gpu_env(int rank);

// The GPU of local rank `local_rank` among `device_count` visible GPUs. Shared: local_rank %
// device_count. Otherwise one GPU per rank: local_rank, or 0 when one GPU is visible (a launcher
// that gives each rank its own GPU through CUDA_VISIBLE_DEVICES); a local rank past the last GPU
// is a ConfigError that suggests --share-gpu.
int gpu_for_local_rank(int local_rank, int device_count, bool share);

}  // namespace meshtrain
