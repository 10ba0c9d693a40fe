// The NCCL communicator on one rank: every collective and dtype moves the right bytes (outputs
// poisoned first), splits, a device mesh over it, and a hung collective turning into a CommError
// that names the collective, the communicator and the rank.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "cuda_test_util.h"
#include "meshtrain/comm/nccl/nccl_communicator.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {
namespace {

std::unique_ptr<NcclCommunicator> one_rank(const std::string& name, CommTimeouts t = {}) {
  cuda_backend();  // fails clearly without a GPU
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  return NcclCommunicator::create(id, 1, 0, 0, name, t);
}

template <typename T>
Tensor host_iota(int64_t n, double scale) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(float(double(i % 97) * scale - 20.0));
  return Tensor::from_vector(v, Shape{n});
}

Tensor host_of(DType dt, int64_t n) {
  switch (dt) {
    case DType::kF32: return host_iota<float>(n, 0.25);
    case DType::kF64: return host_iota<double>(n, 0.25);
    case DType::kBF16: return host_iota<BFloat16>(n, 0.25);
    case DType::kI32: return host_iota<int32_t>(n, 1.0);
    case DType::kI64: return host_iota<int64_t>(n, 1.0);
  }
  return {};
}

std::vector<double> values(const Tensor& h) {
  std::vector<double> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[size_t(i)] = h.item_as_double(i);
  return v;
}

TEST(Nccl, NvlsIsOffByDefault) {
  auto c = one_rank("nvls");
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(v, nullptr);
  EXPECT_STREQ(v, "0");
}

TEST(Nccl, OneRankCollectivesEveryDtype) {
  Backend& be = cuda_backend();
  auto comm = one_rank("smoke");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  Stream& s = be.stream(0);
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 1000;
    Tensor h = host_of(dt, n);
    const std::vector<double> want = values(h);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      Tensor d = to_device(be, h);
      comm->all_reduce(d, op, s).wait();
      EXPECT_EQ(values(to_host(be, d)), want) << "all_reduce " << reduce_op_name(op);
    }
    Tensor in = to_device(be, h);
    Tensor out = Tensor::empty(Shape{n}, dt, be.allocator());
    poison(out.raw(), out.nbytes(), s);
    comm->all_gather(in, out, s).wait();
    EXPECT_EQ(values(to_host(be, out)), want) << "all_gather";
    poison(out.raw(), out.nbytes(), s);
    comm->reduce_scatter(in, out, ReduceOp::kSum, s).wait();
    EXPECT_EQ(values(to_host(be, out)), want) << "reduce_scatter";
    Tensor bc = to_device(be, h);
    comm->broadcast(bc, 0, s).wait();
    EXPECT_EQ(values(to_host(be, bc)), want) << "broadcast";
  }
}

TEST(Nccl, OneRankAllToAllVMovesTheCountedRows) {
  Backend& be = cuda_backend();
  auto comm = one_rank("a2a");
  Stream& s = be.stream(0);
  const int64_t rows = 10, cols = 6, used = 7;
  Tensor h = host_of(DType::kF32, rows * cols).view(Shape{rows, cols});
  Tensor in = to_device(be, h);
  Tensor out = Tensor::empty(Shape{rows, cols}, DType::kF32, be.allocator());
  poison(out.raw(), out.nbytes(), s);
  comm->all_to_all_v(in, {used}, out, {used}, s).wait();
  std::vector<double> got = values(to_host(be, out)), want = values(h);
  for (int64_t i = 0; i < used * cols; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << i;
  for (int64_t i = used * cols; i < rows * cols; ++i)
    ASSERT_TRUE(std::isnan(got[size_t(i)]))
        << "row " << i / cols << " beyond the counts was written";
}

TEST(Nccl, InPlaceAllGatherAndArgumentErrors) {
  Backend& be = cuda_backend();
  auto comm = one_rank("args");
  Stream& s = be.stream(0);
  Tensor d = to_device(be, host_of(DType::kF32, 64));
  comm->all_gather(d, d, s).wait();  // block rank() of the output: in place
  Tensor wrong = Tensor::empty(Shape{32}, DType::kF32, be.allocator());
  EXPECT_THROW(comm->all_gather(d, wrong, s), ShapeError);
  Tensor other = Tensor::empty(Shape{64}, DType::kF64, be.allocator());
  EXPECT_THROW(comm->all_reduce(Tensor::from_vector(std::vector<float>(4, 1.f), Shape{4}),
                                ReduceOp::kSum, s),
               ValueError);  // a host tensor
  EXPECT_THROW(comm->all_gather(d, other, s), ValueError);
  comm->barrier();
}

TEST(Nccl, SplitAndDeviceMeshOnOneRank) {
  Backend& be = cuda_backend();
  auto world = one_rank("world");
  EXPECT_EQ(world->split(-1, 0, "left_out"), nullptr);
  auto child = world->split(3, 0, "child");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->name(), "child");
  ParallelDims dims;
  dims.world = 1;
  dims.validate();
  DeviceMesh mesh(*world, dims);
  Tensor d = to_device(be, host_of(DType::kF32, 128));
  mesh.comm(MeshGroup::kFsdp).all_reduce(d, ReduceOp::kSum, be.stream(0)).wait();
  EXPECT_EQ(values(to_host(be, d)), values(host_of(DType::kF32, 128)));
}

// The stream is blocked for 3 s by a host callback ahead of the all_reduce; with a 0.5 s train
// timeout, waiting on the stream must end in a CommError naming the op, the communicator and the
// rank, and the aborted communicator refuses further calls.

TEST(Nccl, HungCollectiveBecomesCommError) {
  Backend& be = cuda_backend();
  auto comm = one_rank("hang", CommTimeouts{.init_seconds = 60, .train_seconds = 0.5});
  Stream& s = be.stream(0);
  Tensor d = to_device(be, host_of(DType::kF32, 256));
  hold_stream(s, 3000);
  comm->all_reduce(d, ReduceOp::kSum, s);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.synchronize();
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
    EXPECT_NE(m.find("'hang'"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 of 1"), std::string::npos) << m;
    EXPECT_NE(m.find("train_timeout_seconds"), std::string::npos) << m;
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 2.9) << "the error should come after ~0.5 s, not after the stream unblocks";
  EXPECT_TRUE(comm->aborted());
  EXPECT_THROW(comm->all_reduce(d, ReduceOp::kSum, s), CommError);
  be.synchronize();  // the callback ends; the stream drains
}

}  // namespace
}  // namespace meshtrain::cudatest
