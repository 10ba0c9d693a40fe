// NcclCommunicator (see header): blocking creation, calls settled against timeouts, the
// per-communicator event pool, and the watchdog that CUDA host waits poll.
#include "meshtrain/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/comm/comm_dtype.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain {
namespace {

// NVLink multicast (NVLS) stays off unless the user chose otherwise: on the shared machines this
// project runs on, a program that uses it can take the host's GPUs out of service.
const bool kNvlsOff = [] {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  return true;
}();

std::atomic<uint64_t> g_enqueue_seq{0};

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  MT_THROW(ValueError, "nccl communicator: unsupported reduce op {}", int(op));
}

std::string nccl_text(ncclComm_t comm, ncclResult_t rc) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{} (ncclResult {}){}{}", ncclGetErrorString(rc), int(rc),
                     last && *last ? "; NCCL says: " : "", last ? last : "");
}

// Polls a non-blocking call's communicator until it leaves ncclInProgress. Returns the settled
// result, or ncclInProgress when `timeout_s` passed first.
ncclResult_t poll_settled(ncclComm_t comm, ncclResult_t rc, double timeout_s) {
  if (rc != ncclInProgress) return rc;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  int64_t sleep_us = 1;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 1000);
  }
}

class NcclEvent final : public Event {
 public:
  NcclEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~NcclEvent() override {
    if (e_) cudaEventDestroy(e_);
  }
  void record(Stream& s) override { CUDA_CHECK(cudaEventRecord(e_, native_stream(s))); }
  void wait(Stream& s) override { CUDA_CHECK(cudaStreamWaitEvent(native_stream(s), e_, 0)); }
  void synchronize() override { cuda_wait_event(e_, "a collective"); }
  float elapsed_ms(const Event&) const override {
    MT_THROW(InternalError, "collective completion events are created without timing");
  }
  cudaEvent_t native() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Every NCCL communicator of the process, checked from CUDA host waits.
class Watchdog final : public SyncWatcher {
 public:
  void add(NcclCommunicator* c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
    if (!registered_) add_sync_watcher(this);
    registered_ = true;
  }
  void remove(NcclCommunicator* c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
    if (comms_.empty() && registered_) {
      remove_sync_watcher(this);
      registered_ = false;
    }
  }
  void abort_all() {
    for (NcclCommunicator* c : snapshot())
      if (!c->aborted()) c->abort_now();
  }

  void poll(double waited_s) override {
    std::vector<NcclCommunicator*> cs = snapshot();
    for (NcclCommunicator* c : cs) {
      if (c->aborted()) continue;
      ncclResult_t st = c->async_state();
      if (st == ncclSuccess || st == ncclInProgress) continue;
      // Name the collective it was in and, when a peer process ended (status files of the
      // collective watchdog), that rank: the lost-rank case of README "Faults".
      NcclCommunicator::PendingOp p;
      const std::string in =
          c->oldest_pending(p) ? fmt::format(" in collective {} #{}", p.op, p.call) : "";
      const std::string lost = describe_lost_peers(2.0);
      std::string msg = fmt::format(
          "{}: NCCL reported an asynchronous error{}: {}{}. Every NCCL communicator of this "
          "process was aborted",
          c->who(), in, nccl_text(c->native(), st), lost.empty() ? "" : "; " + lost);
      abort_all();
      throw CommError(msg, __FILE__, __LINE__);
    }
    NcclCommunicator* culprit = nullptr;
    NcclCommunicator::PendingOp oldest;
    for (NcclCommunicator* c : cs) {
      NcclCommunicator::PendingOp p;
      if (c->aborted() || !c->oldest_pending(p)) continue;
      if (!culprit || p.seq < oldest.seq) {
        culprit = c;
        oldest = p;
      }
    }
    if (!culprit || waited_s <= culprit->timeouts().train_seconds) return;
    const double age =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest.enqueued).count();
    std::string msg = fmt::format(
        "collective {} #{} on {} did not complete: the host waited {:.0f} s for work behind it "
        "([comm] train_timeout_seconds = {:g}; it was enqueued {:.0f} s ago). A peer rank is "
        "stuck or dead, or the ranks issued collectives in different orders. Every NCCL "
        "communicator of this process was aborted",
        oldest.op, oldest.call, culprit->who(), waited_s, culprit->timeouts().train_seconds, age);
    abort_all();
    throw CommError(msg, __FILE__, __LINE__);
  }

 private:
  std::vector<NcclCommunicator*> snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return comms_;
  }
  std::mutex mu_;
  std::vector<NcclCommunicator*> comms_;
  bool registered_ = false;
};

Watchdog& watchdog() {
  static auto* w = new Watchdog;  // never destroyed: communicators may outlive static teardown
  return *w;
}

}  // namespace

struct NcclCommunicator::Slot {
  NcclEvent event;
  const char* op = nullptr;
  uint64_t call = 0;  // this communicator's call number (the same on every rank)
  uint64_t global_seq = 0;
  std::chrono::steady_clock::time_point enqueued;
  bool pending = false;
};

ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
  }
  MT_THROW(ValueError, "nccl communicator: unsupported dtype {}", dtype_name(d));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const ncclUniqueId& id, int nranks,
                                                           int rank, int device,
                                                           const std::string& name,
                                                           const CommTimeouts& timeouts) {
  (void)kNvlsOff;
  MT_CHECK_T(ValueError, nranks >= 1 && rank >= 0 && rank < nranks,
             "nccl communicator '{}': rank {} is outside a world of {}", name, rank, nranks);
  CUDA_CHECK(cudaSetDevice(device));
  // Blocking mode, and no ncclConfig_t: on the H200 image the non-blocking split failed
  // ("Attempt to use communicator before the previous operation returned ncclSuccess") and the
  // config struct of these headers may not match the runtime library's. Hangs inside a step are
  // still caught by the host-wait watchdog; a rank that never joins init is not bounded here.
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRank(&comm, nranks, id, rank);
  rc = comm ? poll_settled(comm, rc, timeouts.init_seconds) : rc;
  if (rc == ncclInProgress) {
    ncclCommAbort(comm);
    MT_THROW(CommError,
             "creating NCCL communicator '{}' (rank {} of {}) did not finish within {:g} s ([comm] "
             "init_timeout_seconds): some ranks never joined; check that every rank started and "
             "that the rendezvous address (MASTER_ADDR / NCCL_COMM_ID) is reachable",
             name, rank, nranks, timeouts.init_seconds);
  }
  if (rc != ncclSuccess) {
    std::string text = nccl_text(comm, rc);
    if (comm) ncclCommAbort(comm);
    MT_THROW(CommError, "creating NCCL communicator '{}' (rank {} of {}) failed: {}", name, rank,
             nranks, text);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, name, device, timeouts));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, std::string name, int device,
                                   const CommTimeouts& timeouts)
    : comm_(comm), name_(std::move(name)), device_(device), timeouts_(timeouts) {
  NCCL_CHECK(ncclCommCount(comm_, &size_));
  NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  slots_.reserve(kEventPool);
  for (int i = 0; i < kEventPool; ++i) slots_.push_back(std::make_unique<Slot>());
  watchdog().add(this);
}

NcclCommunicator::~NcclCommunicator() {
  watchdog().remove(this);
  if (!aborted_ && comm_) {
    // Finalize flushes outstanding work; bounded so a dead peer cannot hang the exit.
    ncclResult_t rc =
        poll_settled(comm_, ncclCommFinalize(comm_), std::min(timeouts_.train_seconds, 60.0));
    if (rc == ncclSuccess) {
      rc = ncclCommDestroy(comm_);
      if (rc != ncclSuccess && rc != ncclInProgress)
        log_warn("{}: ncclCommDestroy failed: {}", who(), ncclGetErrorString(rc));
    } else {
      log_warn("{}: finalize did not complete ({}); aborting it", who(),
               rc == ncclInProgress ? std::string("timed out") : nccl_text(comm_, rc));
      ncclCommAbort(comm_);
    }
  }
  if (barrier_buf_) cudaFree(barrier_buf_);
  if (barrier_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(barrier_stream_));
}

std::string NcclCommunicator::who() const {
  return fmt::format("communicator '{}' (rank {} of {})", name_, rank_, size_);
}

void NcclCommunicator::check_usable(const char* op) const {
  MT_CHECK_T(CommError, !aborted_,
             "{}: {} called after the communicator was aborted by an earlier error or timeout",
             who(), op);
}

void NcclCommunicator::check_tensor(const Tensor& t, const char* op, const char* which) const {
  check_comm_tensor(t, device(), name_, op, which);
}

void NcclCommunicator::settle(ncclResult_t rc, const char* call, const char* op, double timeout_s) {
  rc = poll_settled(comm_, rc, timeout_s);
  if (rc == ncclSuccess) return;
  if (rc == ncclInProgress) {
    watchdog().abort_all();
    MT_THROW(CommError,
             "{} on {}: {} did not return within {:g} s (a peer never joined the connection "
             "setup). Every NCCL communicator of this process was aborted",
             op, who(), call, timeout_s);
  }
  std::string text = nccl_text(comm_, rc);
  // Argument errors leave the communicator usable; anything else is fatal for it.
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) abort_now();
  MT_THROW(CommError, "{} on {}: {} failed: {}", op, who(), call, text);
}

Work NcclCommunicator::done(const char* op, Stream& s) { return done_on(op, native_stream(s)); }

Work NcclCommunicator::done_on(const char* op, void* stream) {
  Slot& slot = *slots_[size_t(next_slot_)];
  next_slot_ = (next_slot_ + 1) % kEventPool;
  slot.op = op;
  slot.call = ++calls_;
  slot.global_seq = ++g_enqueue_seq;
  slot.enqueued = std::chrono::steady_clock::now();
  CUDA_CHECK(cudaEventRecord(slot.event.native(), static_cast<cudaStream_t>(stream)));
  slot.pending = true;
  return Work{&slot.event};
}

bool NcclCommunicator::oldest_pending(PendingOp& out) {
  bool found = false;
  for (auto& sp : slots_) {
    Slot& slot = *sp;
    if (!slot.pending) continue;
    cudaError_t rc = cudaEventQuery(slot.event.native());
    if (rc == cudaSuccess) {
      slot.pending = false;
      continue;
    }
    if (rc != cudaErrorNotReady) CUDA_CHECK(rc);
    if (!found || slot.global_seq < out.seq) {
      out.op = slot.op;
      out.seq = slot.global_seq;
      out.call = slot.call;
      out.enqueued = slot.enqueued;
      found = true;
    }
  }
  return found;
}

ncclResult_t NcclCommunicator::async_state() const {
  ncclResult_t state = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
  return q != ncclSuccess ? q : state;
}

void NcclCommunicator::abort_now() {
  if (aborted_) return;
  aborted_ = true;
  for (auto& s : slots_) s->pending = false;
  // In blocking mode ncclCommAbort can wait for work already queued on the stream; run it on
  // its own thread so the error that follows reaches the user now (the process is exiting).
  std::thread([comm = comm_, name = who()] {
    ncclResult_t rc = ncclCommAbort(comm);
    if (rc != ncclSuccess) log_warn("{}: ncclCommAbort failed: {}", name, ncclGetErrorString(rc));
  }).detach();
}

// ---- collectives --------------------------------------------------------------------------

Work NcclCommunicator::all_gather(const Tensor& in, const Tensor& out, Stream& s) {
  const char* op = "all_gather";
  check_usable(op);
  check_tensor(in, op, "input");
  check_tensor(out, op, "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(), "{}: all_gather input is {} but output is {}",
             who(), in.dtype(), out.dtype());
  MT_CHECK_T(ShapeError, out.numel() == int64_t(size_) * in.numel(),
             "{}: all_gather expects an output of {} × {} = {} elements, found input {} and "
             "output {}",
             who(), size_, in.numel(), int64_t(size_) * in.numel(), in.shape(), out.shape());
  const char* own = static_cast<const char*>(out.raw()) + size_t(rank_) * in.nbytes();
  MT_CHECK_T(
      ValueError,
      in.raw() == own || !comm_ranges_overlap(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
      "{}: all_gather input overlaps the output without being block {} of it (NCCL's "
      "only in-place form)",
      who(), rank_);
  if (in.numel() > 0)
    settle(ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_dtype(in.dtype()), comm_,
                         native_stream(s)),
           "ncclAllGather", op, timeouts_.train_seconds);
  return done(op, s);
}

Work NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp rop,
                                      Stream& s) {
  const char* op = "reduce_scatter";
  check_usable(op);
  check_tensor(in, op, "input");
  check_tensor(out, op, "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(),
             "{}: reduce_scatter input is {} but output is {}", who(), in.dtype(), out.dtype());
  MT_CHECK_T(ShapeError, in.numel() == int64_t(size_) * out.numel(),
             "{}: reduce_scatter expects an input of {} × {} = {} elements, found input {} and "
             "output {}",
             who(), size_, out.numel(), int64_t(size_) * out.numel(), in.shape(), out.shape());
  const char* own = static_cast<const char*>(in.raw()) + size_t(rank_) * out.nbytes();
  MT_CHECK_T(
      ValueError,
      out.raw() == own || !comm_ranges_overlap(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
      "{}: reduce_scatter output overlaps the input without being block {} of it (NCCL's "
      "only in-place form)",
      who(), rank_);
  if (out.numel() > 0)
    settle(ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()), nccl_dtype(in.dtype()),
                             nccl_op(rop), comm_, native_stream(s)),
           "ncclReduceScatter", op, timeouts_.train_seconds);
  return done(op, s);
}

Work NcclCommunicator::all_reduce(const Tensor& inout, ReduceOp rop, Stream& s) {
  const char* op = "all_reduce";
  check_usable(op);
  check_tensor(inout, op, "inout");
  if (inout.numel() > 0)
    settle(ncclAllReduce(inout.raw(), inout.raw(), size_t(inout.numel()), nccl_dtype(inout.dtype()),
                         nccl_op(rop), comm_, native_stream(s)),
           "ncclAllReduce", op, timeouts_.train_seconds);
  return done(op, s);
}

Work NcclCommunicator::broadcast(const Tensor& inout, int root, Stream& s) {
  const char* op = "broadcast";
  check_usable(op);
  check_tensor(inout, op, "inout");
  MT_CHECK_T(ValueError, root >= 0 && root < size_,
             "{}: broadcast root must be in [0, {}), found {}", who(), size_, root);
  if (inout.numel() > 0)
    settle(ncclBroadcast(inout.raw(), inout.raw(), size_t(inout.numel()), nccl_dtype(inout.dtype()),
                         root, comm_, native_stream(s)),
           "ncclBroadcast", op, timeouts_.train_seconds);
  return done(op, s);
}

Work NcclCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                                    const Tensor& out, const std::vector<int64_t>& recv_rows,
                                    Stream& s) {
  const char* op = "all_to_all_v";
  check_usable(op);
  check_tensor(in, op, "input");
  check_tensor(out, op, "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(), "{}: all_to_all_v input is {} but output is {}",
             who(), in.dtype(), out.dtype());
  MT_CHECK_T(ShapeError, in.shape().rank() >= 1 && out.shape().rank() >= 1,
             "{}: all_to_all_v needs tensors of rank >= 1, found {} and {}", who(), in.shape(),
             out.shape());
  const int64_t row = comm_row_elems(in);
  MT_CHECK_T(ShapeError, comm_row_elems(out) == row,
             "{}: all_to_all_v rows differ: input {} has {} elements per row, output {} has {}",
             who(), in.shape(), row, out.shape(), comm_row_elems(out));
  MT_CHECK_T(ValueError, int(send_rows.size()) == size_ && int(recv_rows.size()) == size_,
             "{}: all_to_all_v needs {} send and recv counts, found {} and {}", who(), size_,
             send_rows.size(), recv_rows.size());
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < size_; ++p) {
    MT_CHECK_T(ValueError, send_rows[size_t(p)] >= 0 && recv_rows[size_t(p)] >= 0,
               "{}: all_to_all_v row counts must be >= 0, found send {} / recv {} for peer {}",
               who(), send_rows[size_t(p)], recv_rows[size_t(p)], p);
    send_total += send_rows[size_t(p)];
    recv_total += recv_rows[size_t(p)];
  }
  MT_CHECK_T(ShapeError, send_total <= in.shape()[0] && recv_total <= out.shape()[0],
             "{}: all_to_all_v sends {} rows from an input of {} and receives {} rows into an "
             "output of {}",
             who(), send_total, in.shape()[0], recv_total, out.shape()[0]);
  const size_t row_bytes = size_t(row) * dtype_size(in.dtype());
  MT_CHECK_T(ValueError,
             !comm_ranges_overlap(in.raw(), size_t(send_total) * row_bytes, out.raw(),
                                  size_t(recv_total) * row_bytes),
             "{}: all_to_all_v input and output overlap", who());
  const ncclDataType_t type = nccl_dtype(in.dtype());
  const cudaStream_t st = native_stream(s);
  NCCL_CHECK(ncclGroupStart());
  int64_t soff = 0, roff = 0;
  for (int p = 0; p < size_; ++p) {
    const int64_t ns = send_rows[size_t(p)], nr = recv_rows[size_t(p)];
    if (ns > 0)
      NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + size_t(soff) * row_bytes,
                          size_t(ns * row), type, p, comm_, st));
    if (nr > 0)
      NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + size_t(roff) * row_bytes,
                          size_t(nr * row), type, p, comm_, st));
    soff += ns;
    roff += nr;
  }
  settle(ncclGroupEnd(), "ncclGroupEnd", op, timeouts_.train_seconds);
  return done(op, s);
}

void NcclCommunicator::barrier() {
  const char* op = "barrier";
  check_usable(op);
  if (!barrier_buf_) {
    // Outside the counted allocators (the communicator has no backend): 4 bytes, made on the
    // first barrier, which no training step calls.
    CUDA_CHECK(cudaMalloc(&barrier_buf_, 4));
    cudaStream_t st = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    barrier_stream_ = st;
  }
  const cudaStream_t st = static_cast<cudaStream_t>(barrier_stream_);
  settle(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, st),
         "ncclAllReduce", op, timeouts_.train_seconds);
  Work w = done_on(op, st);
  // Host wait: barrier() is a host-side rendezvous by definition.
  w.wait();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  check_usable("split");
  ncclComm_t child = nullptr;
  // config nullptr: the child inherits the parent's (blocking) configuration.
  ncclResult_t rc =
      ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr);
  if (child) {
    rc = poll_settled(child, rc, timeouts_.init_seconds);
    if (rc != ncclSuccess) {
      std::string text = rc == ncclInProgress ? fmt::format(
                                                    "no result within {:g} s ([comm] "
                                                    "init_timeout_seconds)",
                                                    timeouts_.init_seconds)
                                              : nccl_text(child, rc);
      ncclCommAbort(child);
      MT_THROW(CommError, "splitting '{}' from {} (color {}, key {}) failed: {}", name, who(),
               color, key, text);
    }
  }
  // The parent takes part in the split too: let its state settle before it is used again.
  settle(child || rc == ncclInProgress ? ncclInProgress : rc, "ncclCommSplit", "split",
         timeouts_.init_seconds);
  if (color < 0) return nullptr;
  MT_CHECK_T(CommError, child != nullptr, "splitting '{}' from {}: NCCL returned no communicator",
             name, who());
  return std::unique_ptr<Communicator>(new NcclCommunicator(child, name, device_, timeouts_));
}

}  // namespace meshtrain
