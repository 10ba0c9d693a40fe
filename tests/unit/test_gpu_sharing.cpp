// The shared-GPU test mode, host side: the MESHTRAIN_SHARE_GPU switch and its bad values, the NCCL
// variables a rank sets (never over the user's own), the GPU each local rank takes with and
// without sharing, the one-rank-per-GPU check the nccl backend runs on the gathered GPU
// identities, and the launcher forwarding the switch to every rank.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/core/gpu_sharing.h"
#include "meshtrain/launch/bootstrap.h"

using namespace meshtrain;

namespace {

EnvLookup fake(const std::map<std::string, std::string>& env) {
  return [env](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}

TEST(GpuSharing, SwitchValues) {
  EXPECT_FALSE(share_gpu_requested(fake({})));
  EXPECT_FALSE(share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", ""}})));
  EXPECT_FALSE(share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", "0"}})));
  EXPECT_FALSE(share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", "Off"}})));
  EXPECT_TRUE(share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", "1"}})));
  EXPECT_TRUE(share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", "TRUE"}})));
  EXPECT_EQ(config_error([] {
              share_gpu_requested(fake({{"MESHTRAIN_SHARE_GPU", "2"}}));
            }),
            "MESHTRAIN_SHARE_GPU must be 1 (ranks share GPUs: a test setup) or 0, found '2'; "
            "`meshtrain train --share-gpu` sets it");
}

TEST(GpuSharing, NcclEnvironmentPerRank) {
  using Vars = std::vector<std::pair<std::string, std::string>>;
  const Vars rank3 = share_gpu_nccl_env(3, fake({}));
  EXPECT_EQ(rank3, (Vars{{"NCCL_HOSTID", "meshtrain-share-3"},
                         {"NCCL_NET", "Socket"},
                         {"NCCL_SOCKET_IFNAME", "lo"},
                         {"NCCL_P2P_DISABLE", "1"},
                         {"NCCL_SHM_DISABLE", "1"},
                         {"NCCL_IB_DISABLE", "1"},
                         {"NCCL_NVLS_ENABLE", "0"}}));
  // Every rank its own host identity.
  EXPECT_NE(share_gpu_nccl_env(0, fake({}))[0], share_gpu_nccl_env(1, fake({}))[0]);
  // What the user set stays theirs (an interface other than lo, their own host ids).
  const Vars user = share_gpu_nccl_env(
      1,
      fake({{"NCCL_SOCKET_IFNAME", "eth0"}, {"NCCL_HOSTID", "mine-1"}, {"NCCL_NVLS_ENABLE", ""}}));
  for (const auto& [k, v] : user) {
    EXPECT_NE(k, "NCCL_SOCKET_IFNAME");
    EXPECT_NE(k, "NCCL_HOSTID");
    EXPECT_NE(k, "NCCL_NVLS_ENABLE");
  }
  EXPECT_EQ(user.size(), 4u);
}

TEST(GpuSharing, ApplySetsOnlyUnsetVariables) {
  ::setenv("NCCL_SOCKET_IFNAME", "user-if", 1);
  ::unsetenv("NCCL_HOSTID");
  apply_share_gpu_env(5);
  EXPECT_STREQ(std::getenv("NCCL_HOSTID"), "meshtrain-share-5");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "user-if");
  EXPECT_STREQ(std::getenv("NCCL_P2P_DISABLE"), "1");
  for (const char* v : {"NCCL_HOSTID", "NCCL_NET", "NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE",
                        "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"})
    ::unsetenv(v);
}

TEST(GpuSharing, DeviceForLocalRank) {
  // Shared: ranks wrap around the visible GPUs; with one GPU every rank takes it.
  EXPECT_EQ(gpu_for_local_rank(5, 1, true), 0);
  EXPECT_EQ(gpu_for_local_rank(5, 4, true), 1);
  EXPECT_EQ(gpu_for_local_rank(7, 8, true), 7);
  // One GPU per rank: its own; one visible GPU (CUDA_VISIBLE_DEVICES per rank) is device 0.
  EXPECT_EQ(gpu_for_local_rank(3, 8, false), 3);
  EXPECT_EQ(gpu_for_local_rank(3, 1, false), 0);
  EXPECT_EQ(config_error([] { gpu_for_local_rank(4, 4, false); }),
            "local rank 4 needs GPU 4, but this process sees 4 GPUs: start at most 4 ranks per "
            "node, give each rank one GPU with CUDA_VISIBLE_DEVICES, or, for a test, let the "
            "ranks share GPUs: `meshtrain train --nproc N --share-gpu` (under mpirun: -x "
            "MESHTRAIN_SHARE_GPU=1)");
  EXPECT_EQ(config_error([] { gpu_for_local_rank(0, 0, true); }),
            "no usable GPU: 0 devices visible");
}

TEST(GpuSharing, OneRankPerGpuCheck) {
  EXPECT_NO_THROW(check_one_rank_per_gpu({11, 12, 13, 14}, "GPU 0", 4));
  EXPECT_NO_THROW(check_one_rank_per_gpu({}, "GPU 0", 1));
  EXPECT_EQ(config_error([] {
              check_one_rank_per_gpu({7, 9, 7}, "GPU 0 (PCI 0000:19:00.0) on host 'h'", 1);
            }),
            "ranks 0 and 2 use the same GPU on the same host (this rank: GPU 0 (PCI "
            "0000:19:00.0) on host 'h'; 1 GPU(s) visible), which NCCL refuses (\"Duplicate GPU "
            "detected\"): start at most 1 ranks per node, one GPU each, or, for a test, let the "
            "ranks share GPUs: `meshtrain train --nproc N --share-gpu` (under mpirun: -x "
            "MESHTRAIN_SHARE_GPU=1)");
}

TEST(GpuSharing, LauncherForwardsTheSwitch) {
  const auto shared = local_launch_command("mpirun", 4, "/m", {"train"}, false, true);
  EXPECT_EQ(shared, (std::vector<std::string>{"mpirun", "-np", "4", "--oversubscribe", "--bind-to",
                                              "none", "-x", "OPENBLAS_NUM_THREADS", "-x",
                                              "MESHTRAIN_SHARE_GPU", "/m", "train"}));
  const auto plain = local_launch_command("mpirun", 4, "/m", {"train"}, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), "MESHTRAIN_SHARE_GPU"), 0);
}

}  // namespace
