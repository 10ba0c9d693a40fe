// Launch detection from fake environments (OpenMPI, torchrun, Slurm, none, precedence and
// malformed values), --nproc argument handling, the mpirun command line, and the Runtime's
// guarantees in this real run (ranks set, one Runtime, backend registry).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "dist_util.h"
#include "meshtrain/comm/mpi/mpi_communicator.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"

using namespace meshtrain;

namespace {

LaunchInfo detect(const std::map<std::string, std::string>& env) {
  return detect_launch([&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string detect_error(const std::map<std::string, std::string>& env) {
  try {
    detect(env);
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}

std::vector<char*> argv_of(std::vector<std::string>& a) {
  std::vector<char*> v;
  for (auto& s : a) v.push_back(s.data());
  v.push_back(nullptr);
  return v;
}

}  // namespace

TEST(DistBootstrap, DetectsOpenMpi) {
  auto li = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "8"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(li.launcher, "mpirun");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world_size, 8);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_world_size, 2);
  EXPECT_EQ(li.describe(), "launcher mpirun: rank 3 of 8 (local 1 of 2)");
}

TEST(DistBootstrap, DetectsTorchrunWithoutTouchingMasterPort) {
  auto li = detect({{"RANK", "5"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "node7"},
                    {"MASTER_PORT", "29500"},
                    {"NCCL_COMM_ID", "10.0.0.1:4000"}});
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world_size, 8);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_world_size, 4);
  EXPECT_EQ(li.master_addr, "node7");
  EXPECT_EQ(li.master_port, 29500);
  EXPECT_EQ(li.bootstrap_port, 29501);
  EXPECT_EQ(li.nccl_comm_id, "10.0.0.1:4000");
  auto top = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65535"}});
  EXPECT_EQ(top.bootstrap_port, 65534);
  auto chosen = detect({{"RANK", "0"},
                        {"WORLD_SIZE", "2"},
                        {"MASTER_PORT", "29500"},
                        {"MESHTRAIN_BOOTSTRAP_PORT", "31000"}});
  EXPECT_EQ(chosen.bootstrap_port, 31000);
  EXPECT_EQ(detect_error({{"RANK", "0"},
                          {"WORLD_SIZE", "2"},
                          {"MASTER_PORT", "29500"},
                          {"MESHTRAIN_BOOTSTRAP_PORT", "29500"}}),
            "MESHTRAIN_BOOTSTRAP_PORT=29500 equals MASTER_PORT, which torchrun's agent owns; "
            "pick another port");
}

TEST(DistBootstrap, DetectsSlurmSteps) {
  auto li = detect({{"SLURM_PROCID", "5"},
                    {"SLURM_STEP_NUM_TASKS", "8"},
                    {"SLURM_NTASKS", "16"},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                    {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(li.launcher, "slurm");
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world_size, 8);  // the step's tasks, not the allocation's
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_world_size, 4);
  EXPECT_EQ(li.bootstrap_port, 20000 + 123456 % 20000);
  auto mixed = detect({{"SLURM_PROCID", "6"},
                       {"SLURM_NTASKS", "7"},
                       {"SLURM_STEP_ID", "0"},
                       {"SLURM_LOCALID", "0"},
                       {"SLURM_NODEID", "3"},
                       {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  EXPECT_EQ(mixed.world_size, 7);
  EXPECT_EQ(mixed.local_world_size, 1);
  // A batch script sees SLURM_PROCID and the allocation's SLURM_NTASKS but is one process.
  auto batch = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_JOB_ID", "1"}});
  EXPECT_EQ(batch.launcher, "none");
  EXPECT_EQ(batch.world_size, 1);
  EXPECT_EQ(detect_error({{"SLURM_PROCID", "0"},
                          {"SLURM_STEP_NUM_TASKS", "4"},
                          {"SLURM_NODEID", "2"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2"}}),
            "slurm launch: SLURM_STEP_TASKS_PER_NODE='2' lists 1 nodes, but SLURM_NODEID is 2");
}

TEST(DistBootstrap, PrecedenceAndNone) {
  auto both = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"SLURM_PROCID", "0"},
                      {"SLURM_STEP_NUM_TASKS", "1"}});
  EXPECT_EQ(both.launcher, "mpirun");
  auto torch_in_slurm = detect(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}});
  EXPECT_EQ(torch_in_slurm.launcher, "torchrun");
  EXPECT_EQ(torch_in_slurm.rank, 3);
  auto none = detect({});
  EXPECT_EQ(none.launcher, "none");
  EXPECT_EQ(none.rank, 0);
  EXPECT_EQ(none.world_size, 1);
  EXPECT_EQ(none.local_world_size, 1);
  EXPECT_EQ(none.bootstrap_port, 0);
}

TEST(DistBootstrap, MalformedEnvironmentMessages) {
  EXPECT_EQ(detect_error({{"RANK", "x1"}, {"WORLD_SIZE", "4"}}),
            "torchrun launch: environment variable RANK='x1' is not an integer");
  EXPECT_EQ(detect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "torchrun launch: rank 4 is outside world size 4");
  EXPECT_EQ(detect_error({{"OMPI_COMM_WORLD_SIZE", "2"}}),
            "mpirun launch: environment variable OMPI_COMM_WORLD_RANK is not set");
  EXPECT_EQ(detect_error({{"OMPI_COMM_WORLD_RANK", "0"},
                          {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "mpirun launch: local rank 2 is outside local world size 2");
}

TEST(DistBootstrap, NprocArguments) {
  std::vector<std::string> a{"meshtrain", "train", "--nproc", "4", "--config", "x.toml"};
  auto av = argv_of(a);
  EXPECT_EQ(nproc_from_args(int(a.size()), av.data()), 4);
  EXPECT_EQ(args_without_nproc(int(a.size()), av.data()),
            (std::vector<std::string>{"train", "--config", "x.toml"}));
  std::vector<std::string> b{"meshtrain", "train", "--nproc=3", "--steps", "2"};
  auto bv = argv_of(b);
  EXPECT_EQ(nproc_from_args(int(b.size()), bv.data()), 3);
  EXPECT_EQ(args_without_nproc(int(b.size()), bv.data()),
            (std::vector<std::string>{"train", "--steps", "2"}));
  std::vector<std::string> c{"meshtrain", "train"};
  auto cv = argv_of(c);
  EXPECT_EQ(nproc_from_args(int(c.size()), cv.data()), 0);
  auto err = [](std::vector<std::string> v) {
    auto p = argv_of(v);
    try {
      nproc_from_args(int(v.size()), p.data());
    } catch (const ConfigError& e) {
      return e.message();
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(err({"m", "--nproc", "abc"}), "--nproc expects a positive integer, found 'abc'");
  EXPECT_EQ(err({"m", "--nproc"}), "--nproc expects a positive integer, found ''");
  EXPECT_EQ(err({"m", "--nproc=0"}), "--nproc expects a positive integer, found '0'");
  EXPECT_EQ(err({"m", "--nproc", "2", "--nproc=4"}), "--nproc given twice (2 and 4)");
}

TEST(DistBootstrap, LocalLaunchCommand) {
  EXPECT_EQ(local_launch_command("/usr/bin/mpirun", 4, "/opt/meshtrain", {"train", "--x"}, true),
            (std::vector<std::string>{"/usr/bin/mpirun", "-np", "4", "--oversubscribe",
                                      "--allow-run-as-root", "--bind-to", "none", "-x",
                                      "OPENBLAS_NUM_THREADS", "/opt/meshtrain", "train", "--x"}));
  auto user = local_launch_command("mpirun", 2, "/m", {}, false);
  EXPECT_EQ(std::count(user.begin(), user.end(), "--allow-run-as-root"), 0);
  EXPECT_FALSE(find_on_path("sh").empty());
  EXPECT_EQ(find_on_path("meshtrain-no-such-program-xyz"), "");
}

// Under mpirun launch_local refuses (ranks exist already); as a single process with no mpirun
// on PATH it names the missing program. Neither branch spawns anything.
TEST(DistBootstrap, LaunchLocalRefusesClearly) {
  std::vector<std::string> a{"meshtrain", "train", "--nproc", "2"};
  auto av = argv_of(a);
  const auto& li = dist::runtime().launch();
  std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  if (li.launcher == "none") ::setenv("PATH", "/nonexistent-meshtrain-dir", 1);
  try {
    launch_local(2, int(a.size()), av.data());
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string want = li.launcher == "none"
                           ? "--nproc 2 starts ranks with mpirun, which is not on PATH"
                           : fmt::format("already launched by {} (rank {} of {}); drop --nproc",
                                         li.launcher, li.rank, li.world_size);
    EXPECT_NE(e.message().find(want), std::string::npos) << e.message();
  }
  ::setenv("PATH", saved.c_str(), 1);
}

TEST(DistBootstrap, RuntimeSetsRanksAndIsUnique) {
  Runtime& rt = dist::runtime();
  EXPECT_EQ(rt.world_size(), dist::world().size());
  EXPECT_EQ(rt.rank(), dist::world().rank());
  EXPECT_EQ(error_rank(), rt.rank());
  EXPECT_EQ(log_rank(), rt.rank());
  EXPECT_TRUE(rt.mpi_initialized());
  EXPECT_EQ(rt.world().name(), "world");
  if (rt.world_size() > 1) {
    EXPECT_EQ(rt.launch().launcher, "mpirun");
  }
  try {
    Runtime second(nullptr, nullptr);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message(),
              "a meshtrain Runtime already exists in this process; create exactly one in main()");
  }
}

TEST(DistBootstrap, CommBackendRegistry) {
  Runtime& rt = dist::runtime();
  EXPECT_EQ(&rt.world("mpi"), &rt.world());
  try {
    rt.world("nccl-missing");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("communicator backend 'nccl-missing' is not available in this "
                               "build (available: mpi"),
              std::string::npos)
        << e.message();
  }
  register_comm_backend("test_dup", [](Runtime&) -> std::unique_ptr<Communicator> {
    return MpiCommunicator::dup_world("world");
  });
  Communicator& w = rt.world("test_dup");
  EXPECT_EQ(&rt.world("test_dup"), &w);  // created once
  EXPECT_EQ(w.size(), dist::nranks());
  Tensor t = Tensor::from_vector<int32_t>({1}, Shape{1});
  w.all_reduce(t, ReduceOp::kSum, dist::stream());
  EXPECT_EQ(t.data<int32_t>()[0], dist::nranks());
}
