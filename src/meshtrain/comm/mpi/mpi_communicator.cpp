// MPI collectives on host tensors. Float sums (reduce-scatter, all-reduce) add each element's
// values in rank order, so a result never depends on the buffer's length (bucketed collectives
// sum like single ones); the test-only ring order (see the header) gives that up, as NCCL does.
// bf16 reductions are staged: convert to float32 buffers, reduce, convert back, so each element
// is rounded to bf16 once (a bf16 MPI_Op would round after every pairwise step). Counts beyond
// MPI's int range throw.
#include "meshtrain/comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/comm/comm_dtype.h"
#include "meshtrain/comm/mpi/mpi_check.h"
#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

// The MPI type that moves elements of `d` (bf16 moves as its 16-bit pattern).
MPI_Datatype mpi_move_type(DType d) {
  switch (d) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
  }
  MT_THROW(ValueError, "MPI communicator: unsupported dtype {}", dtype_name(d));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  MT_THROW(ValueError, "MPI communicator: unsupported reduce op {}", int(op));
}

int mpi_count(int64_t n, const std::string& comm, const char* collective, const char* what) {
  if (n > int64_t(INT_MAX))
    MT_THROW(CommError,
             "communicator '{}': {} {} of {} elements exceeds MPI's int count limit {}; split "
             "it into smaller collectives",
             comm, collective, what, n, INT_MAX);
  return int(n);
}

// out[j] = blocks[first][j] op blocks[first + 1][j] op ... over all ranks, wrapping around (blocks
// of m elements; out may be block 0 itself). first = 0: rank order.
template <typename T>
void reduce_blocks_from(const T* blocks, T* out, int64_t m, int ranks, ReduceOp op, int first) {
  for (int64_t j = 0; j < m; ++j) {
    T acc = blocks[int64_t(first) * m + j];
    for (int k = 1; k < ranks; ++k) {
      const T v = blocks[int64_t((first + k) % ranks) * m + j];
      acc = op == ReduceOp::kSum   ? T(acc + v)
            : op == ReduceOp::kMax ? std::max(acc, v)
                                   : std::min(acc, v);
    }
    out[j] = acc;
  }
}

// MESHTRAIN_MPI_SUM_ORDER: "rank" (unset: the default) or "ring".
bool ring_sum_order() {
  const char* v = std::getenv(kMpiSumOrderVar);
  if (v == nullptr || std::strcmp(v, "rank") == 0) return false;
  MT_CHECK_T(ConfigError, std::strcmp(v, "ring") == 0,
             "{}={} is not a sum order: expected rank (the default) or ring", kMpiSumOrderVar, v);
  return true;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)) {
  MT_CHECK(comm_ != MPI_COMM_NULL, "MpiCommunicator '{}' built on MPI_COMM_NULL", name_);
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  first_block_ = ring_sum_order() ? (rank_ + 1) % size_ : 0;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::dup_world(const std::string& name) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiCommunicator>(dup, name);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A destructor must not throw; a failed free at shutdown leaks one handle and nothing else.
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

size_t MpiCommunicator::staging_bytes() const {
  size_t n = 0;
  for (const Tensor& t : staging_) n += t.defined() ? t.nbytes() : 0;
  return n;
}

float* MpiCommunicator::staging(int slot, int64_t numel) {
  Tensor& t = staging_[slot];
  if (!t.defined() || t.numel() < numel)
    t = Tensor::empty(Shape{numel}, DType::kF32, cpu_allocator());
  return t.data<float>();
}

Work MpiCommunicator::all_gather(const Tensor& in, const Tensor& out, Stream&) {
  CollectiveScope in_flight("all_gather", name_);  // the watchdog names it if it hangs
  check_comm_tensor(in, device(), name_, "all_gather", "input");
  check_comm_tensor(out, device(), name_, "all_gather", "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(),
             "communicator '{}': all_gather input is {} but output is {}", name_,
             dtype_name(in.dtype()), dtype_name(out.dtype()));
  MT_CHECK_T(ShapeError, out.numel() == int64_t(size_) * in.numel(),
             "communicator '{}': all_gather expects output of {} × {} = {} elements, found "
             "input {} and output {}",
             name_, size_, in.numel(), int64_t(size_) * in.numel(), in.shape(), out.shape());
  MPI_Datatype type = mpi_move_type(in.dtype());
  int n = mpi_count(in.numel(), name_, "all_gather", "input");
  mpi_count(out.numel(), name_, "all_gather", "output");
  const char* own_block = static_cast<const char*>(out.raw()) + size_t(rank_) * in.nbytes();
  if (in.nbytes() > 0 && in.raw() == own_block) {
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.raw(), n, type, comm_));
    return {};
  }
  MT_CHECK_T(ValueError, !comm_ranges_overlap(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
             "communicator '{}': all_gather input overlaps the output without being block {} "
             "of it (the only in-place form MPI allows)",
             name_, rank_);
  MPI_CHECK(MPI_Allgather(in.raw(), n, type, out.raw(), n, type, comm_));
  return {};
}

Work MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream&) {
  CollectiveScope in_flight("reduce_scatter", name_);  // the watchdog names it if it hangs
  check_comm_tensor(in, device(), name_, "reduce_scatter", "input");
  check_comm_tensor(out, device(), name_, "reduce_scatter", "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(),
             "communicator '{}': reduce_scatter input is {} but output is {}", name_,
             dtype_name(in.dtype()), dtype_name(out.dtype()));
  MT_CHECK_T(ShapeError, in.numel() == int64_t(size_) * out.numel(),
             "communicator '{}': reduce_scatter expects input of {} × {} = {} elements, found "
             "input {} and output {}",
             name_, size_, out.numel(), int64_t(size_) * out.numel(), in.shape(), out.shape());
  MT_CHECK_T(ValueError, !comm_ranges_overlap(in.raw(), in.nbytes(), out.raw(), out.nbytes()),
             "communicator '{}': reduce_scatter input and output overlap; MPI needs separate "
             "buffers",
             name_);
  // Not MPI_Reduce_scatter_block: Open MPI picks its algorithm (and so the order of the float
  // additions) by message size and rank count, so a bucket would not sum like its tensors alone.
  // Here every rank receives block rank() of each peer's input (one all-to-all, the bytes of a
  // ring reduce-scatter) and adds the blocks in rank order: the result of an element depends only
  // on its values, never on the buffer around it (in ring order: also on the block it is in).
  int m = mpi_count(out.numel(), name_, "reduce_scatter", "output");
  mpi_count(in.numel(), name_, "reduce_scatter", "input");
  if (comm_needs_staging(in.dtype())) {
    float* a = staging(0, in.numel());
    float* b = staging(1, in.numel());
    bf16_to_f32(static_cast<const BFloat16*>(in.raw()), a, in.numel());
    MPI_CHECK(MPI_Alltoall(a, m, MPI_FLOAT, b, m, MPI_FLOAT, comm_));
    reduce_blocks_from(b, b, m, size_, op, first_block_);
    f32_to_bf16(b, static_cast<BFloat16*>(out.raw()), out.numel());
    return {};
  }
  const size_t elem = dtype_size(in.dtype());
  void* recv = staging(1, (int64_t(in.nbytes()) + 3) / 4);
  MPI_Datatype type = mpi_move_type(in.dtype());
  MPI_CHECK(MPI_Alltoall(in.raw(), m, type, recv, m, type, comm_));
  auto reduce = [&](auto* typed_out) {
    using T = std::remove_pointer_t<decltype(typed_out)>;
    reduce_blocks_from(static_cast<const T*>(recv), typed_out, m, size_, op, first_block_);
  };
  switch (in.dtype()) {
    case DType::kF32: reduce(out.data<float>()); break;
    case DType::kF64: reduce(out.data<double>()); break;
    case DType::kI32: reduce(out.data<int32_t>()); break;
    case DType::kI64: reduce(out.data<int64_t>()); break;
    default:
      MT_THROW(ValueError, "communicator '{}': reduce_scatter of {} ({} bytes each) unsupported",
               name_, dtype_name(in.dtype()), elem);
  }
  return {};
}

// Every rank sends block r of its buffer (n elements cut into size_ blocks of m = ceil(n / size_),
// the last zero-padded) to rank r, adds the blocks it receives in rank order and all-gathers the
// sums: the bytes of a ring all-reduce, and an element's sum depends only on its values, never on
// the length of the buffer around it (in ring order it does: the block decides where a sum starts).
// When n divides by size_ the buffer itself is sent and gathered into (no copies); otherwise
// a zero-padded staging copy is.
template <typename T>
void MpiCommunicator::sum_over_ranks(T* data, int64_t n, MPI_Datatype type) {
  if (size_ == 1 || n == 0) return;
  const int64_t m = (n + size_ - 1) / size_;
  const int count = mpi_count(m * size_, name_, "all_reduce", "padded buffer") / size_;
  const int64_t words = (m * int64_t(sizeof(T)) * size_ + 3) / 4;
  const bool padded = m * size_ != n;
  T* send = data;
  if (padded) {
    send = reinterpret_cast<T*>(staging(1, words));
    std::copy(data, data + n, send);
    std::fill(send + n, send + m * size_, T(0));
  }
  T* recv = reinterpret_cast<T*>(staging(2, words));
  MPI_CHECK(MPI_Alltoall(send, count, type, recv, count, type, comm_));
  reduce_blocks_from(recv, recv, m, size_, ReduceOp::kSum, first_block_);
  MPI_CHECK(MPI_Allgather(recv, count, type, send, count, type, comm_));
  if (padded) std::copy(send, send + n, data);
}

Work MpiCommunicator::all_reduce(const Tensor& inout, ReduceOp op, Stream&) {
  CollectiveScope in_flight("all_reduce", name_);  // the watchdog names it if it hangs
  check_comm_tensor(inout, device(), name_, "all_reduce", "inout");
  int n = mpi_count(inout.numel(), name_, "all_reduce", "buffer");
  // Float sums: not MPI_Allreduce, whose algorithm (and so the order of the additions) Open MPI
  // picks by message size and rank count: here a bucket of gradients sums like each gradient
  // alone (see sum_over_ranks). Max, min and integer sums are exact in any order.
  const bool float_sum = op == ReduceOp::kSum && is_floating(inout.dtype());
  if (comm_needs_staging(inout.dtype())) {
    float* a = staging(0, inout.numel());
    bf16_to_f32(static_cast<const BFloat16*>(inout.raw()), a, inout.numel());
    if (float_sum)
      sum_over_ranks(a, inout.numel(), MPI_FLOAT);
    else
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, mpi_op(op), comm_));
    f32_to_bf16(a, static_cast<BFloat16*>(inout.raw()), inout.numel());
    return {};
  }
  if (float_sum && inout.dtype() == DType::kF32) {
    sum_over_ranks(inout.data<float>(), inout.numel(), MPI_FLOAT);
    return {};
  }
  if (float_sum) {
    sum_over_ranks(inout.data<double>(), inout.numel(), MPI_DOUBLE);
    return {};
  }
  MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, inout.raw(), n, mpi_move_type(inout.dtype()), mpi_op(op), comm_));
  return {};
}

void MpiCommunicator::check_alltoall_counts(const std::vector<int64_t>& send_rows,
                                            const std::vector<int64_t>& recv_rows) {
  a2a_peer_counts_.assign(size_t(size_), 0);
  MPI_CHECK(MPI_Alltoall(send_rows.data(), 1, MPI_INT64_T, a2a_peer_counts_.data(), 1, MPI_INT64_T,
                         comm_));
  int first_bad_peer = -1;
  for (int p = 0; p < size_ && first_bad_peer < 0; ++p)
    if (a2a_peer_counts_[size_t(p)] != recv_rows[size_t(p)]) first_bad_peer = p;
  // Every rank learns whether any rank disagrees, so all of them throw together.
  int flag = first_bad_peer >= 0 ? rank_ + 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, comm_));
  if (first_bad_peer >= 0)
    MT_THROW(CommError,
             "communicator '{}': all_to_all_v on rank {} expects recv_rows[{}] = {} rows from "
             "peer {}, but that peer sends {}",
             name_, rank_, first_bad_peer, recv_rows[size_t(first_bad_peer)], first_bad_peer,
             a2a_peer_counts_[size_t(first_bad_peer)]);
  if (flag != 0)
    MT_THROW(CommError,
             "communicator '{}': all_to_all_v row counts disagree on rank {} (its recv_rows do "
             "not match what its peers send); no rows were moved",
             name_, flag - 1);
}

Work MpiCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                                   const Tensor& out, const std::vector<int64_t>& recv_rows,
                                   Stream&) {
  CollectiveScope in_flight("all_to_all_v", name_);  // the watchdog names it if it hangs
  check_comm_tensor(in, device(), name_, "all_to_all_v", "input");
  check_comm_tensor(out, device(), name_, "all_to_all_v", "output");
  MT_CHECK_T(ValueError, in.dtype() == out.dtype(),
             "communicator '{}': all_to_all_v input is {} but output is {}", name_,
             dtype_name(in.dtype()), dtype_name(out.dtype()));
  MT_CHECK_T(ShapeError, in.shape().rank() >= 1 && out.shape().rank() >= 1,
             "communicator '{}': all_to_all_v moves dim-0 rows, found input {} and output {}",
             name_, in.shape(), out.shape());
  const int64_t row = comm_row_elems(in);
  MT_CHECK_T(ShapeError, comm_row_elems(out) == row,
             "communicator '{}': all_to_all_v rows differ: input {} has {} elements per row, "
             "output {} has {}",
             name_, in.shape(), row, out.shape(), comm_row_elems(out));
  MT_CHECK_T(ShapeError, int(send_rows.size()) == size_ && int(recv_rows.size()) == size_,
             "communicator '{}': all_to_all_v expects {} send and recv counts, found {} and {}",
             name_, size_, send_rows.size(), recv_rows.size());
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < size_; ++p) {
    MT_CHECK_T(ValueError, send_rows[size_t(p)] >= 0 && recv_rows[size_t(p)] >= 0,
               "communicator '{}': all_to_all_v row counts must be >= 0, found send {} recv {} "
               "for peer {}",
               name_, send_rows[size_t(p)], recv_rows[size_t(p)], p);
    send_total += send_rows[size_t(p)];
    recv_total += recv_rows[size_t(p)];
  }
  MT_CHECK_T(ShapeError, send_total <= in.shape()[0] && recv_total <= out.shape()[0],
             "communicator '{}': all_to_all_v sends {} rows from input capacity {} and receives "
             "{} rows into output capacity {}",
             name_, send_total, in.shape()[0], recv_total, out.shape()[0]);
  const size_t row_bytes = size_t(row) * dtype_size(in.dtype());
  MT_CHECK_T(ValueError,
             !comm_ranges_overlap(in.raw(), size_t(send_total) * row_bytes, out.raw(),
                                  size_t(recv_total) * row_bytes),
             "communicator '{}': all_to_all_v input and output rows overlap; MPI needs separate "
             "buffers",
             name_);
  mpi_count(send_total * row, name_, "all_to_all_v", "input rows");
  mpi_count(recv_total * row, name_, "all_to_all_v", "output rows");
  if (check_counts_) check_alltoall_counts(send_rows, recv_rows);

  // Layout: [send counts | send displs | recv counts | recv displs], in elements.
  a2a_ints_.assign(4 * size_t(size_), 0);
  int* sc = a2a_ints_.data();
  int* sd = sc + size_;
  int* rc = sd + size_;
  int* rd = rc + size_;
  int64_t soff = 0, roff = 0;
  for (int p = 0; p < size_; ++p) {
    sc[p] = int(send_rows[size_t(p)] * row);
    sd[p] = int(soff);
    rc[p] = int(recv_rows[size_t(p)] * row);
    rd[p] = int(roff);
    soff += sc[p];
    roff += rc[p];
  }
  MPI_Datatype type = mpi_move_type(in.dtype());
  MPI_CHECK(MPI_Alltoallv(in.raw(), sc, sd, type, out.raw(), rc, rd, type, comm_));
  return {};
}

Work MpiCommunicator::broadcast(const Tensor& inout, int root, Stream&) {
  CollectiveScope in_flight("broadcast", name_);  // the watchdog names it if it hangs
  check_comm_tensor(inout, device(), name_, "broadcast", "inout");
  MT_CHECK_T(ValueError, root >= 0 && root < size_,
             "communicator '{}': broadcast root must be in [0, {}), found {}", name_, size_, root);
  int n = mpi_count(inout.numel(), name_, "broadcast", "buffer");
  MPI_CHECK(MPI_Bcast(inout.raw(), n, mpi_move_type(inout.dtype()), root, comm_));
  return {};
}

void MpiCommunicator::barrier() {
  CollectiveScope in_flight("barrier", name_);
  MPI_CHECK(MPI_Barrier(comm_));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  CollectiveScope in_flight("split", name_);  // the watchdog names it if it hangs
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(sub, name);
}

}  // namespace meshtrain
