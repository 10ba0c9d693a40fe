// MpiCommunicator: the Communicator over MPI for CPU tensors. Every call completes before it
// returns (Work{} is already done) and uses MPI's blocking collectives, whose reduction order is
// fixed by (communicator size, message size) and never by arrival order: same inputs give
// bitwise-same outputs, run to run, on every rank.
//
// Float sums add the ranks' values in rank order, the same order for every element. For tests,
// MESHTRAIN_MPI_SUM_ORDER=ring makes each rank start its block's sum at the next rank and wrap
// around, as NCCL's ring reduce-scatter does: each shard then sums in another order, so equal
// gradient rows can come out unequal in their last bits. CPU runs can then show what depends on
// the reduction order before a GPU run does.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

inline constexpr const char* kMpiSumOrderVar = "MESHTRAIN_MPI_SUM_ORDER";

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor, unless MPI is already finalised) and
  // installs MPI_ERRORS_RETURN on it so MPI_CHECK turns failures into CommError.
  MpiCommunicator(MPI_Comm comm, std::string name);
  // A private duplicate of MPI_COMM_WORLD, so meshtrain's traffic never matches user messages.
  static std::unique_ptr<MpiCommunicator> dup_world(const std::string& name = "world");
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device{DeviceType::kCPU, 0}; }

  // all_gather runs in place (MPI_IN_PLACE) when `in` is exactly block rank() of `out`.
  Work all_gather(const Tensor& in, const Tensor& out, Stream& s) override;
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream& s) override;
  Work all_reduce(const Tensor& inout, ReduceOp op, Stream& s) override;
  // Before moving data, every rank checks that its recv_rows match what each peer sends
  // (one small all-to-all of counts); a mismatch throws CommError on every rank of the
  // communicator, so no rank is left waiting. set_check_counts(false) skips the exchange.
  Work all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                    const std::vector<int64_t>& recv_rows, Stream& s) override;
  Work broadcast(const Tensor& inout, int root, Stream& s) override;
  void barrier() override;
  // color < 0 leaves this rank out (MPI_UNDEFINED) and returns nullptr on it.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  MPI_Comm native() const { return comm_; }
  void set_check_counts(bool on) { check_counts_ = on; }
  // Bytes held by the staging buffers of bf16 reductions, float all-reduce sums and
  // reduce_scatter receives (grown at most to the largest request, then reused: steps after the
  // first allocate nothing).
  size_t staging_bytes() const;

 private:
  // Float32 staging views of at least `numel` elements; grows (one allocation) only when a
  // larger reduction than any before arrives.
  float* staging(int slot, int64_t numel);
  // data[0..n) summed over the ranks element by element, from rank first_block_ on (see
  // all_reduce).
  template <typename T>
  void sum_over_ranks(T* data, int64_t n, MPI_Datatype type);
  void check_alltoall_counts(const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  bool check_counts_ = true;
  int first_block_ = 0;  // whose block a sum starts from: 0, or rank() + 1 with ring sums
  Tensor staging_[3];
  // Host-side count/displacement arrays for MPI_Alltoallv, reused between calls.
  std::vector<int> a2a_ints_;
  std::vector<int64_t> a2a_peer_counts_;
};

}  // namespace meshtrain
