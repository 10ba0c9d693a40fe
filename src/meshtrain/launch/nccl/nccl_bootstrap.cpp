// Registers communicator backend "nccl": the world communicator of a CUDA run. The unique id
// reaches every rank as launch/bootstrap.h describes: one rank alone makes its own; under an MPI
// job rank 0 makes it and broadcasts it over the MPI world; without MPI (torchrun, srun) every
// rank derives it from NCCL_COMM_ID (set from MASTER_ADDR:bootstrap_port when the launcher did
// not set it), and NCCL's rank 0 hosts the rendezvous there. Under MPI the ranks first check
// that no two of them sit on one GPU unless they share it on purpose (--share-gpu).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>

#include "meshtrain/comm/nccl/nccl_communicator.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain {
namespace {

static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0, "unique id moves as int32 words");

ncclUniqueId unique_id_for(Runtime& rt) {
  const LaunchInfo& li = rt.launch();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (li.world_size == 1) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  }
  if (rt.mpi_initialized()) {
    if (li.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    Communicator& mpi = rt.world("mpi");
    Tensor bytes = Tensor::wrap(&id, Shape{int64_t(sizeof(id) / sizeof(int32_t))}, DType::kI32,
                                Device{DeviceType::kCPU, 0});
    auto cpu = create_backend("cpu", 0);
    mpi.broadcast(bytes, 0, cpu->stream(0));
    return id;
  }
  if (li.nccl_comm_id.empty()) {
    MT_CHECK_T(ConfigError, !li.master_addr.empty() && li.bootstrap_port > 0,
               "the nccl backend under a {} launch with {} ranks needs a rendezvous: launch with "
               "mpirun (or meshtrain --nproc), or set MASTER_ADDR (the first host) and MASTER_PORT "
               "or MESHTRAIN_BOOTSTRAP_PORT, or NCCL_COMM_ID=host:port; found MASTER_ADDR='{}', "
               "bootstrap port {}",
               li.launcher, li.world_size, li.master_addr, li.bootstrap_port);
    const std::string addr = fmt::format("{}:{}", li.master_addr, li.bootstrap_port);
    // Every rank must see the same address before ncclGetUniqueId reads it.
    setenv("NCCL_COMM_ID", addr.c_str(), 1);
  }
  // With NCCL_COMM_ID set, ncclGetUniqueId only encodes that address: every rank computes the
  // same id, and rank 0's ncclCommInitRank listens there.
  NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

// Two ranks of one host on one GPU fail inside NCCL with "Duplicate GPU detected" and no hint;
// gather every rank's GPU identity over MPI first and say what to do instead.
void check_gpu_per_rank(Runtime& rt, int device) {
  if (!rt.mpi_initialized() || rt.world_size() == 1) return;
  char bus[64] = {0};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
  char host[256] = {0};
  const char* hostid = std::getenv("NCCL_HOSTID");
  if (!hostid || !*hostid) {
    ::gethostname(host, sizeof(host) - 1);
    hostid = host;
  }
  int visible = 0;
  CUDA_CHECK(cudaGetDeviceCount(&visible));
  std::vector<uint64_t> keys(size_t(rt.world_size()), 0);
  keys[size_t(rt.rank())] = std::hash<std::string>{}(fmt::format("{}|{}", hostid, bus));
  uint64_t mine = keys[size_t(rt.rank())];
  Communicator& mpi = rt.world("mpi");
  const Device cpu{DeviceType::kCPU, 0};
  auto backend = create_backend("cpu", 0);
  mpi.all_gather(Tensor::wrap(&mine, Shape{1}, DType::kI64, cpu),
                 Tensor::wrap(keys.data(), Shape{int64_t(keys.size())}, DType::kI64, cpu),
                 backend->stream(0));
  check_one_rank_per_gpu(keys, fmt::format("GPU {} (PCI {}) on host '{}'", device, bus, hostid),
                         visible);
}

const bool kRegistered = [] {
  register_comm_backend("nccl", [](Runtime& rt) -> std::unique_ptr<Communicator> {
    const LaunchInfo& li = rt.launch();
    MT_CHECK_T(ConfigError, cuda_device_present(),
               "communicator backend 'nccl' needs a GPU, and this process sees none");
    const int device = cuda_device_for_local_rank(li.local_rank);
    CUDA_CHECK(cudaSetDevice(device));
    check_gpu_per_rank(rt, device);
    ncclUniqueId id = unique_id_for(rt);
    return NcclCommunicator::create(id, li.world_size, li.rank, device, "world",
                                    rt.comm_timeouts());
  });
  return true;
}();

}  // namespace
}  // namespace meshtrain
