// Launch detection, the Runtime (MPI init/finalise, world communicator, error and log ranks) and
// abort_all. Environment parsing is strict: a malformed launcher variable is a ConfigError that
// names it, never a silent single-process run.
#include "meshtrain/launch/bootstrap.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>

#include "meshtrain/comm/mpi/mpi_check.h"
#include "meshtrain/comm/mpi/mpi_communicator.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {
namespace {

struct EnvReader {
  const EnvLookup& env;
  std::string launcher;

  bool has(const char* key) const {
    const char* v = env(key);
    return v && *v;
  }
  std::string str(const char* key) const { return has(key) ? std::string(env(key)) : ""; }
  int integer(const char* key) const {
    const char* v = env(key);
    MT_CHECK_T(ConfigError, v && *v, "{} launch: environment variable {} is not set", launcher,
               key);
    errno = 0;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    MT_CHECK_T(ConfigError,
               errno == 0 && end != v && *end == '\0' && x >= INT32_MIN && x <= INT32_MAX,
               "{} launch: environment variable {}='{}' is not an integer", launcher, key, v);
    return int(x);
  }
  int integer_or(const char* key, int fallback) const { return has(key) ? integer(key) : fallback; }
};

// Slurm's "2(x3),1" task-count lists: the entry covering node `node`.
int slurm_tasks_on_node(const std::string& spec, int node, const std::string& var) {
  int seen = 0;
  size_t i = 0;
  while (i < spec.size()) {
    size_t end = spec.find(',', i);
    std::string item = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
    int count = 0, reps = 1;
    if (std::sscanf(item.c_str(), "%d(x%d)", &count, &reps) < 1 || count < 1 || reps < 1)
      MT_THROW(ConfigError, "slurm launch: cannot parse {}='{}' (expected a list like 2(x3),1)",
               var, spec);
    if (node < seen + reps) return count;
    seen += reps;
    if (end == std::string::npos) break;
    i = end + 1;
  }
  MT_THROW(ConfigError, "slurm launch: {}='{}' lists {} nodes, but SLURM_NODEID is {}", var, spec,
           seen, node);
}

void validate(const LaunchInfo& li) {
  MT_CHECK_T(ConfigError, li.world_size >= 1, "{} launch: world size must be >= 1, found {}",
             li.launcher, li.world_size);
  MT_CHECK_T(ConfigError, li.rank >= 0 && li.rank < li.world_size,
             "{} launch: rank {} is outside world size {}", li.launcher, li.rank, li.world_size);
  MT_CHECK_T(ConfigError, li.local_world_size >= 1 && li.local_world_size <= li.world_size,
             "{} launch: local world size {} must be in [1, world size {}]", li.launcher,
             li.local_world_size, li.world_size);
  MT_CHECK_T(ConfigError, li.local_rank >= 0 && li.local_rank < li.local_world_size,
             "{} launch: local rank {} is outside local world size {}", li.launcher, li.local_rank,
             li.local_world_size);
}

void fill_rendezvous(LaunchInfo& li, const EnvReader& e) {
  li.master_addr = e.str("MASTER_ADDR");
  li.master_port = e.integer_or("MASTER_PORT", 0);
  li.nccl_comm_id = e.str("NCCL_COMM_ID");
  if (e.has("MESHTRAIN_BOOTSTRAP_PORT")) {
    li.bootstrap_port = e.integer("MESHTRAIN_BOOTSTRAP_PORT");
    MT_CHECK_T(ConfigError, li.bootstrap_port > 0 && li.bootstrap_port < 65536,
               "MESHTRAIN_BOOTSTRAP_PORT must be a TCP port in [1, 65535], found {}",
               li.bootstrap_port);
    MT_CHECK_T(ConfigError, li.bootstrap_port != li.master_port,
               "MESHTRAIN_BOOTSTRAP_PORT={} equals MASTER_PORT, which torchrun's agent owns; "
               "pick another port",
               li.bootstrap_port);
  } else if (li.master_port > 0) {
    li.bootstrap_port = li.master_port < 65535 ? li.master_port + 1 : li.master_port - 1;
  } else if (li.launcher == "slurm" && e.has("SLURM_JOB_ID")) {
    // Same port on every task of the job, spread across jobs sharing a node.
    li.bootstrap_port =
        20000 + int(std::strtoul(e.str("SLURM_JOB_ID").c_str(), nullptr, 10) % 20000u);
  }
}

std::atomic<bool> g_runtime_alive{false};

std::map<std::string, CommBackendFactory>& comm_backends() {
  static std::map<std::string, CommBackendFactory> m;
  return m;
}

}  // namespace

std::string LaunchInfo::describe() const {
  return fmt::format("launcher {}: rank {} of {} (local {} of {})", launcher, rank, world_size,
                     local_rank, local_world_size);
}

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo li;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    EnvReader e{env, "mpirun"};
    li.launcher = e.launcher;
    li.world_size = e.integer("OMPI_COMM_WORLD_SIZE");
    li.rank = e.integer("OMPI_COMM_WORLD_RANK");
    li.local_world_size = e.integer_or("OMPI_COMM_WORLD_LOCAL_SIZE", li.world_size);
    li.local_rank =
        e.integer_or("OMPI_COMM_WORLD_LOCAL_RANK", li.rank % std::max(li.local_world_size, 1));
    fill_rendezvous(li, e);
  } else if (env("RANK") && env("WORLD_SIZE")) {
    EnvReader e{env, "torchrun"};
    li.launcher = e.launcher;
    li.world_size = e.integer("WORLD_SIZE");
    li.rank = e.integer("RANK");
    li.local_world_size = e.integer_or("LOCAL_WORLD_SIZE", li.world_size);
    li.local_rank = e.integer_or("LOCAL_RANK", li.rank % std::max(li.local_world_size, 1));
    fill_rendezvous(li, e);
  } else if (env("SLURM_PROCID") && (env("SLURM_STEP_NUM_TASKS") || env("SLURM_STEP_ID"))) {
    // Only an srun step is a multi-task launch: a batch script also sees SLURM_PROCID=0 and the
    // allocation's SLURM_NTASKS, yet runs as one process.
    EnvReader e{env, "slurm"};
    li.launcher = e.launcher;
    li.world_size = e.has("SLURM_STEP_NUM_TASKS") ? e.integer("SLURM_STEP_NUM_TASKS")
                                                  : e.integer("SLURM_NTASKS");
    li.rank = e.integer("SLURM_PROCID");
    int node = e.integer_or("SLURM_NODEID", 0);
    const char* per_node = e.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                           : e.has("SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                              : nullptr;
    li.local_world_size =
        per_node ? slurm_tasks_on_node(e.str(per_node), node, per_node) : li.world_size;
    li.local_rank = e.integer_or("SLURM_LOCALID", li.rank % std::max(li.local_world_size, 1));
    fill_rendezvous(li, e);
  } else {
    EnvReader e{env, "none"};
    fill_rendezvous(li, e);
  }
  validate(li);
  return li;
}

LaunchInfo detect_launch() {
  return detect_launch([](const char* k) { return static_cast<const char*>(std::getenv(k)); });
}

void register_comm_backend(const std::string& name, CommBackendFactory factory) {
  MT_CHECK(name != "mpi", "communicator backend 'mpi' is built in");
  comm_backends()[name] = std::move(factory);
}

std::vector<std::string> available_comm_backends() {
  std::vector<std::string> names{"mpi"};
  for (const auto& [name, f] : comm_backends()) names.push_back(name);
  return names;
}

Runtime::Runtime(int* argc, char*** argv) : Runtime(argc, argv, detect_launch()) {}

Runtime::Runtime(int* argc, char*** argv, const LaunchInfo& info)
    : info_(info), uncaught_at_start_(std::uncaught_exceptions()) {
  validate(info_);
  // Shared-GPU test mode: the NCCL variables must be in place before NCCL reads them.
  if (share_gpu_requested()) apply_share_gpu_env(info_.rank);
  bool expected = false;
  MT_CHECK_T(ConfigError, g_runtime_alive.compare_exchange_strong(expected, true),
             "a meshtrain Runtime already exists in this process; create exactly one in main()");
  try {
    // torchrun starts plain processes: MPI_Init there would make N singleton worlds of 1.
    bool mpi_possible = !(info_.launcher == "torchrun" && info_.world_size > 1);
    if (mpi_possible) init_mpi(argc, argv);
  } catch (...) {
    g_runtime_alive = false;
    throw;
  }
  set_error_rank(info_.rank);
  set_log_rank(info_.rank, info_.world_size);
}

void Runtime::init_mpi(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  MT_CHECK_T(ConfigError, !finalized,
             "MPI was already finalised in this process (MPI cannot restart); create one "
             "Runtime per process");
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_mpi_ = true;
    if (provided < MPI_THREAD_FUNNELED)
      log_warn(
          "MPI provides thread level {} < MPI_THREAD_FUNNELED; meshtrain calls MPI from "
          "the main thread only, which is still safe in practice",
          provided);
  }
  mpi_ready_ = true;
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (info_.launcher == "none" && size > 1) {
    // Started by an MPI launcher whose variables we do not know: MPI itself is the truth.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &info_.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &info_.local_world_size));
    MPI_CHECK(MPI_Comm_free(&node));
    info_.launcher = "mpi";
    info_.rank = rank;
    info_.world_size = size;
  }
  MT_CHECK_T(ConfigError, size == info_.world_size && rank == info_.rank,
             "{} launched {} ranks (this is rank {}), but MPI_Init formed a world of {} (rank "
             "{}): this MPI cannot join a {} launch directly; start the job with mpirun (inside "
             "the allocation under Slurm) or with meshtrain --nproc",
             info_.launcher, info_.world_size, info_.rank, size, rank, info_.launcher);
  mpi_world_ = MpiCommunicator::dup_world("world");
}

Runtime::~Runtime() {
  // Destroyed by an exception on its way to main's catch: MPI_Finalize would wait for peers
  // that sit in a collective this rank never joins. Leave MPI up so abort_all can end the job.
  if (std::uncaught_exceptions() > uncaught_at_start_ && info_.world_size > 1) {
    g_runtime_alive = false;
    return;
  }
  // Communicators first: MPI_Comm_free is only legal before MPI_Finalize.
  backend_worlds_.clear();
  mpi_world_.reset();
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Unchecked: a destructor cannot throw, and a failed finalise at exit changes nothing.
    if (!finalized) MPI_Finalize();
  }
  g_runtime_alive = false;
}

Communicator& Runtime::world() {
  if (!mpi_world_)
    MT_THROW(ConfigError,
             "launched by {} with world size {}: the MPI communicator needs an MPI job, which {} "
             "does not start; launch with `mpirun -np {} ...` or `meshtrain ... --nproc {}`, or "
             "pick a backend that bootstraps from MASTER_ADDR (available: {})",
             info_.launcher, info_.world_size, info_.launcher, info_.world_size, info_.world_size,
             fmt::join(available_comm_backends(), ", "));
  return *mpi_world_;
}

Communicator& Runtime::world(const std::string& backend) {
  if (backend == "mpi") return world();
  auto it = backend_worlds_.find(backend);
  if (it != backend_worlds_.end()) return *it->second;
  auto f = comm_backends().find(backend);
  MT_CHECK_T(ConfigError, f != comm_backends().end(),
             "communicator backend '{}' is not available in this build (available: {})", backend,
             fmt::join(available_comm_backends(), ", "));
  auto comm = f->second(*this);
  MT_CHECK(comm && comm->size() == info_.world_size,
           "backend '{}' made a world of {} ranks, launch says {}", backend,
           comm ? comm->size() : 0, info_.world_size);
  return *backend_worlds_.emplace(backend, std::move(comm)).first->second;
}

void check_one_rank_per_gpu(const std::vector<uint64_t>& gpu_keys, const std::string& this_gpu,
                            int visible_gpus) {
  std::map<uint64_t, int> first_rank;
  for (int r = 0; r < int(gpu_keys.size()); ++r) {
    auto [it, fresh] = first_rank.emplace(gpu_keys[size_t(r)], r);
    MT_CHECK_T(ConfigError, fresh,
               "ranks {} and {} use the same GPU on the same host (this rank: {}; {} GPU(s) "
               "visible), which NCCL refuses (\"Duplicate GPU detected\"): start at most {} "
               "ranks per node, one GPU each, or, for a test, let the ranks share GPUs: "
               "`meshtrain train --nproc N --share-gpu` (under mpirun: -x {}=1)",
               it->second, r, this_gpu, visible_gpus, visible_gpus, kShareGpuVar);
  }
}

void abort_all(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);  // MPI_Abort does not return; this covers runs without MPI
}

}  // namespace meshtrain
