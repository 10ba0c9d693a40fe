// Process bootstrap: who launched us (mpirun, torchrun, srun or nobody), the Runtime that owns
// MPI and the world Communicator for the life of main(), and the `--nproc N` local launcher.
// Rule: meshtrain never binds MASTER_PORT (torchrun's agent owns it); it only reads it.
//
// How a communicator backend without MPI (the future NCCL one) bootstraps from LaunchInfo:
//  - mpirun: MPI is initialised; rank 0 makes the ncclUniqueId and MPI_Bcast's it on the world.
//  - torchrun --no-python / srun: no MPI job exists. If NCCL_COMM_ID (host:port) is set it is
//    passed through and NCCL's own bootstrap uses it. Otherwise rank 0 listens on
//    master_addr:bootstrap_port (never master_port) and sends the unique id to every rank that
//    connects; under srun the user exports MASTER_ADDR (the first host of the allocation, e.g.
//    `scontrol show hostnames $SLURM_JOB_NODELIST | head -1`), and bootstrap_port derives from
//    the job id when MASTER_PORT is unset. MESHTRAIN_BOOTSTRAP_PORT overrides the derivation.
//  - local_rank picks the GPU; local_world_size bounds it.
// Such a backend registers itself with register_comm_backend() and Runtime::world(name)
// returns it; the Runtime skips MPI_Init where no MPI job can exist (torchrun, world > 1).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/gpu_sharing.h"

namespace meshtrain {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string launcher = "none";  // "mpirun", "torchrun", "slurm" or "none"
  // Rendezvous data for MPI-free backends (see the header comment); empty/0 when unknown.
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT: read, never bound
  int bootstrap_port = 0;    // != master_port; 0 when there is no way to derive one
  std::string nccl_comm_id;  // NCCL_COMM_ID, passed through untouched
  std::string describe() const;
};

// EnvLookup (core/gpu_sharing.h): the variable's value or nullptr; tests pass a fake environment.
// Precedence: OpenMPI (OMPI_COMM_WORLD_*) > torchrun (RANK/WORLD_SIZE/...) > Slurm
// (SLURM_PROCID/SLURM_STEP_NUM_TASKS or SLURM_NTASKS/SLURM_LOCALID/...) > none. A torchrun or
// mpirun inside a Slurm allocation is what launched us, so its variables win. Malformed or
// inconsistent values throw ConfigError naming the variable.
LaunchInfo detect_launch(const EnvLookup& env);
LaunchInfo detect_launch();  // from the process environment

class Runtime;
// Factory for a non-MPI world communicator (for example "nccl"), registered at static-init time.
using CommBackendFactory = std::function<std::unique_ptr<Communicator>(Runtime&)>;
void register_comm_backend(const std::string& name, CommBackendFactory factory);
std::vector<std::string> available_comm_backends();  // always includes "mpi"

// One per process, alive for the whole of main(). In the shared-GPU test mode
// (MESHTRAIN_SHARE_GPU=1, core/gpu_sharing.h) it first sets this rank's NCCL variables, before
// anything can start NCCL. Initialises MPI (MPI_THREAD_FUNNELED: only
// the main thread calls MPI) when launched by mpirun, by srun (OpenMPI's direct launch; the MPI
// world size is checked against Slurm's), or as a single process (OpenMPI singleton mode).
// Sets the rank that errors and logs name, and finalises MPI in the destructor after freeing
// every communicator it made -- except when the destructor runs during stack unwinding with
// world size > 1: then MPI stays up (finalising would wait on peers stuck in a collective) so
// that main's catch can call abort_all. Under torchrun with WORLD_SIZE > 1 no MPI job exists, so
// MPI is left alone and world("mpi") throws a ConfigError that says how to launch instead.
class Runtime {
 public:
  Runtime(int* argc, char*** argv);
  Runtime(int* argc, char*** argv, const LaunchInfo& info);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const LaunchInfo& launch() const { return info_; }
  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  bool mpi_initialized() const { return mpi_ready_; }
  // The MPI world communicator (a private duplicate of MPI_COMM_WORLD named "world").
  Communicator& world();
  // The world communicator of a named backend: "mpi" is world(); others come from
  // register_comm_backend and are created once, on first use.
  Communicator& world(const std::string& backend);
  // Read by backend factories when they create a world: set before the first world(name).
  void set_comm_timeouts(const CommTimeouts& t) { timeouts_ = t; }
  const CommTimeouts& comm_timeouts() const { return timeouts_; }

 private:
  void init_mpi(int* argc, char*** argv);
  LaunchInfo info_;
  int uncaught_at_start_ = 0;
  bool mpi_ready_ = false;
  bool owns_mpi_ = false;
  CommTimeouts timeouts_;
  std::unique_ptr<Communicator> mpi_world_;
  std::map<std::string, std::unique_ptr<Communicator>> backend_worlds_;
};

// One rank per GPU unless the ranks share GPUs on purpose. `gpu_keys[r]` identifies rank r's GPU
// as NCCL sees it: a hash of its host identity (NCCL_HOSTID when set, else the host name) and
// the GPU's PCI bus id. ConfigError naming the first two ranks with the same key -- NCCL would
// fail there with "Duplicate GPU detected" -- that says how many GPUs this process sees
// (`this_gpu` describes this rank's) and suggests --share-gpu. The nccl backend calls it on the
// gathered keys, so every rank throws the same error.
void check_one_rank_per_gpu(const std::vector<uint64_t>& gpu_keys, const std::string& this_gpu,
                            int visible_gpus);

// Ends every rank of the job now: MPI_Abort on the world when MPI is up, else _exit(code).
// A rank that throws while its peers sit in a collective would otherwise hang the job, so
// main() catches, prints its one-line error, flushes, and calls abort_all(1) when the world
// size is > 1 (returning normally is fine for a single process):
//   } catch (const meshtrain::Error& e) {
//     std::fprintf(stderr, "meshtrain: %s\n", e.what());
//     if (world_size > 1) meshtrain::abort_all(1);
//     return 1;
//   }
[[noreturn]] void abort_all(int code);

// --- local launcher: `meshtrain train --nproc N ...` ------------------------------------------
// The N from `--nproc N` or `--nproc=N` anywhere in argv; 0 when absent. ConfigError when the
// value is missing or not a positive integer.
int nproc_from_args(int argc, char** argv);
// argv[1..] without the `--nproc N` / `--nproc=N` tokens.
std::vector<std::string> args_without_nproc(int argc, char** argv);
// Full path of `program` found on PATH (or the program itself when it contains a '/' and is
// executable); empty when not found.
std::string find_on_path(const std::string& program);
// The command launch_local runs: mpirun -np N --oversubscribe [--allow-run-as-root]
// --bind-to none -x OPENBLAS_NUM_THREADS [-x MESHTRAIN_SHARE_GPU] <exe> <args...>.
std::vector<std::string> local_launch_command(const std::string& mpirun, int nproc,
                                              const std::string& exe,
                                              const std::vector<std::string>& args, bool as_root,
                                              bool share_gpu = false);
// Re-executes this binary (/proc/self/exe) under mpirun with N ranks, passing argv minus
// --nproc, waits and returns its exit code (128 + signal if it was killed). Exports
// OPENBLAS_NUM_THREADS=1 unless already set, and forwards MESHTRAIN_SHARE_GPU when set. ConfigError
// when mpirun is not on PATH, when nproc < 1, or when this process was itself launched by
// mpirun/torchrun/srun.
int launch_local(int nproc, int argc, char** argv);

}  // namespace meshtrain
