// NcclCommunicator: the Communicator over NCCL for CUDA tensors (float32, float64, bfloat16,
// int32, int64). Each call enqueues on the stream it is given and returns a Work whose event
// (from a pool of kEventPool owned by the communicator, so nothing is allocated per call) is
// recorded after the collective. A Work stays valid until kEventPool later calls on the same
// communicator.
//
// Hangs become CommErrors. Communicators are created in NCCL's blocking mode (the non-blocking
// split failed on the H200 image; see create()), so a rank that never joins creation is not
// bounded by init_seconds. Calls that still return ncclInProgress are polled against
// train_seconds. A collective that hangs on the GPU is caught by the CUDA
// backend's host waits, which poll a watchdog (no extra thread): once a wait has lasted
// train_seconds while a collective is still outstanding, the oldest outstanding collective of
// any NCCL communicator is reported -- op, sequence number, communicator name, group rank and
// size -- every NCCL communicator of the process is aborted (ncclCommAbort), and the waiting
// thread throws CommError. An asynchronous NCCL error (a dead peer's socket) is reported the same
// way as soon as a wait sees it. A host that never waits is not covered; the trainer waits for
// its input copy every micro-batch.
//
// bfloat16 reductions run natively in NCCL. They do NOT accumulate in float32 across ranks:
// NCCL's sum on sm_80+ is __hadd2 on bf16 pairs (each pairwise add rounded to bf16), and partial
// sums travel between GPUs as bf16, so a ring over k ranks rounds each element k-1 times (tree
// algorithms fewer). Communicator.h's "bfloat16 reductions accumulate in float32" holds for the
// MPI backend only; reduce in float32 ([training] mixed_precision_reduce, the default) where it
// matters.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

class NcclCommunicator final : public Communicator {
 public:
  static constexpr int kEventPool = 64;

  // Creates rank `rank` of an `nranks` communicator from a unique id every rank shares, on CUDA
  // device `device` (made current). Collective over the nranks processes.
  static std::unique_ptr<NcclCommunicator> create(const ncclUniqueId& id, int nranks, int rank,
                                                  int device, const std::string& name,
                                                  const CommTimeouts& timeouts);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device{DeviceType::kCUDA, device_}; }

  // In place when `in` is block rank() of `out` (NCCL's in-place form).
  Work all_gather(const Tensor& in, const Tensor& out, Stream& s) override;
  // In place when `out` is block rank() of `in`.
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream& s) override;
  Work all_reduce(const Tensor& inout, ReduceOp op, Stream& s) override;
  // ncclGroupStart + one ncclSend/ncclRecv per peer with a non-zero row count. Counts that do not
  // match the peers' hang (NCCL cannot check them); the watchdog then names this call.
  Work all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows, Stream& s) override;
  Work broadcast(const Tensor& inout, int root, Stream& s) override;
  // An all_reduce of one int32 on an internal stream, then a host wait for it.
  void barrier() override;
  // ncclCommSplit (collective over this communicator). color < 0 leaves this rank out and
  // returns nullptr; the child inherits the timeouts.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  void set_timeouts(const CommTimeouts& t) { timeouts_ = t; }
  const CommTimeouts& timeouts() const { return timeouts_; }
  ncclComm_t native() const { return comm_; }
  // True once the watchdog (or an error) aborted this communicator; every later call throws.
  bool aborted() const { return aborted_; }

  // Watchdog internals, used by nccl_communicator.cpp's SyncWatcher.
  struct PendingOp {
    const char* op = nullptr;
    uint64_t seq = 0;   // process-wide enqueue order, across communicators
    uint64_t call = 0;  // this communicator's call number (the same on every rank)
    std::chrono::steady_clock::time_point enqueued;
  };
  // The oldest collective of this communicator whose completion event has not fired.
  bool oldest_pending(PendingOp& out);
  // ncclSuccess, ncclInProgress or the asynchronous error NCCL reports.
  ncclResult_t async_state() const;
  void abort_now();
  std::string who() const;  // "communicator 'fsdp' (rank 1 of 4)"

 private:
  NcclCommunicator(ncclComm_t comm, std::string name, int device, const CommTimeouts& timeouts);
  // Throws if the communicator was aborted; `op` names the call in the message.
  void check_usable(const char* op) const;
  // Completes a non-blocking NCCL call: ncclInProgress is polled until it settles or
  // `timeout_s` passes (then the communicator is aborted and CommError names `op`).
  void settle(ncclResult_t rc, const char* call, const char* op, double timeout_s);
  // Records the next pool event on `s` after collective `op` and returns it as the Work.
  Work done(const char* op, Stream& s);
  Work done_on(const char* op, void* cuda_stream);
  void check_tensor(const Tensor& t, const char* op, const char* which) const;

  struct Slot;
  ncclComm_t comm_ = nullptr;
  std::string name_;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  CommTimeouts timeouts_;
  bool aborted_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  int next_slot_ = 0;
  uint64_t calls_ = 0;
  void* barrier_buf_ = nullptr;  // 4 bytes of device memory for barrier()
  void* barrier_stream_ = nullptr;
};

// ncclDataType_t of a meshtrain dtype (every DType maps).
ncclDataType_t nccl_dtype(DType d);

}  // namespace meshtrain
