// Communicator: the collectives meshtrain needs, on tensors of the communicator's device, ordered
// on a stream. The MPI backend (CPU tensors) completes each call before returning; the NCCL
// backend enqueues on the stream and returns a Work whose event marks completion. Buffers are
// contiguous; collectives along dim 0 (all_gather concatenates rank blocks, reduce_scatter gives
// rank r block r). bfloat16 reductions: the MPI backend accumulates in float32; NCCL sums bf16
// natively, rounding at each hop (see nccl/nccl_communicator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

enum class ReduceOp : uint8_t { kSum, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// How long communicator backends that detect hangs (nccl) wait: for communicator creation and
// splits, and for any collective a host wait depends on. [comm] init_timeout_seconds and
// train_timeout_seconds; the defaults are the config's.
struct CommTimeouts {
  double init_seconds = 300;
  double train_seconds = 100;
};

// Completion of one collective. Default-constructed Work is already complete (synchronous
// backends). A device backend sets `event`, recorded on the stream after the collective.
struct Work {
  Event* event = nullptr;
  void wait() const {
    if (event) event->synchronize();
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The mesh dimension or view this communicator serves ("world", "fsdp", "tp", ...).
  virtual const std::string& name() const = 0;
  virtual Device device() const = 0;

  // out = [in of rank 0; in of rank 1; ...]; out.numel() == size() * in.numel().
  virtual Work all_gather(const Tensor& in, const Tensor& out, Stream& s) = 0;
  // out = block rank() of op over ranks of in; in.numel() == size() * out.numel().
  virtual Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream& s) = 0;
  // In place.
  virtual Work all_reduce(const Tensor& inout, ReduceOp op, Stream& s) = 0;
  // Rows (dim-0 slices) exchanged with every peer: rank sends send_rows[p] consecutive rows of
  // `in` to peer p (blocks packed in peer order) and receives recv_rows[p] rows from p into
  // `out` (packed in peer order). in/out may be larger than the rows used (capacity-bounded).
  virtual Work all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                            const Tensor& out, const std::vector<int64_t>& recv_rows,
                            Stream& s) = 0;
  virtual Work broadcast(const Tensor& inout, int root, Stream& s) = 0;
  virtual void barrier() = 0;
  // Ranks with equal color form a new communicator, ordered by key (then by rank).
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
};

}  // namespace meshtrain
