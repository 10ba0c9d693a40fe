// Shared-GPU test mode (see header): the switch, the NCCL variables, the GPU choice.
#include "meshtrain/core/gpu_sharing.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "meshtrain/core/check.h"

namespace meshtrain {

bool share_gpu_requested(const EnvLookup& env) {
  const char* v = env(kShareGpuVar);
  std::string s = v ? v : "";
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty() || s == "0" || s == "false" || s == "no" || s == "off") return false;
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  MT_THROW(ConfigError,
           "{} must be 1 (ranks share GPUs: a test setup) or 0, found '{}'; `meshtrain train "
           "--share-gpu` sets it",
           kShareGpuVar, v);
}

bool share_gpu_requested() {
  return share_gpu_requested([](const char* name) { return std::getenv(name); });
}

std::vector<std::pair<std::string, std::string>> share_gpu_nccl_env(int rank,
                                                                    const EnvLookup& env) {
  const std::vector<std::pair<std::string, std::string>> wanted = {
      // Each rank a host of its own: NCCL then never sees two ranks of one host on one GPU.
      {"NCCL_HOSTID", "meshtrain-share-" + std::to_string(rank)},
      // Different "hosts" talk through the network plugin: sockets over loopback.
      {"NCCL_NET", "Socket"},
      {"NCCL_SOCKET_IFNAME", "lo"},
      // Transports that would short-cut the socket path between ranks of one machine.
      {"NCCL_P2P_DISABLE", "1"},
      {"NCCL_SHM_DISABLE", "1"},
      {"NCCL_IB_DISABLE", "1"},
      {"NCCL_NVLS_ENABLE", "0"}};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& kv : wanted)
    if (!env(kv.first.c_str())) out.push_back(kv);
  return out;
}

void apply_share_gpu_env(int rank) {
  for (const auto& [name, value] :
       share_gpu_nccl_env(rank, [](const char* n) { return std::getenv(n); }))
    ::setenv(name.c_str(), value.c_str(), /*overwrite=*/0);
}

int gpu_for_local_rank(int local_rank, int device_count, bool share) {
  MT_CHECK_T(ConfigError, device_count > 0, "no usable GPU: {} devices visible", device_count);
  MT_CHECK_T(ConfigError, local_rank >= 0, "local rank must be >= 0, found {}", local_rank);
  if (share) return local_rank % device_count;
  if (device_count == 1) return 0;
  MT_CHECK_T(ConfigError, local_rank < device_count,
             "local rank {} needs GPU {}, but this process sees {} GPUs: start at most {} ranks "
             "per node, give each rank one GPU with CUDA_VISIBLE_DEVICES, or, for a test, let "
             "the ranks share GPUs: `meshtrain train --nproc N --share-gpu` (under mpirun: "
             "-x {}=1)",
             local_rank, local_rank, device_count, device_count, kShareGpuVar);
  return local_rank;
}

}  // namespace meshtrain
