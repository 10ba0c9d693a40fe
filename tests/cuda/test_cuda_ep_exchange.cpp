// The expert exchange on CUDA over a one-rank NCCL communicator: ep_counts copies its counts
// through the pinned host buffers made at prepare, the grouped GEMM reads the local groups that
// ep_counts published on the host (no copy, no wait of its own), and steps after the first
// allocate nothing on the host or the device. A planned capacity below the load (capacity factor
// 0.5, every token routed to one expert) takes the row-capacity pool: grown once, then reused,
// and the result still matches the host oracle (dropless). The padded exchange
// (moe/padded_exchange.h) matches the oracle too, never waits on the host (a stream held by a
// sleeping host function does not hold up the launches), counts what does not fit, and its CUDA
// index maps, gathers and overflow counts equal the CPU kernels'.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "cuda_test_util.h"
#include "meshtrain/comm/nccl/nccl_communicator.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/moe/combine.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {
namespace {

struct Result {
  int64_t overflows = 0, grows = 0, allocs_after_first = 0, mallocs_after_first = 0;
  double worst_rel = 0;
  float padded_overflows = 0;  // the padded exchange's device counter after the four runs
  double held_run_ms = 0;      // one run launched behind a host function that sleeps 300 ms
  bool stream_busy_after_held_run = false;
};

// T tokens, top-k over E experts, x [T, D] → y [T, N] = Σ_j x_t · w[e_tj]ᵀ through the exchange.
Result run_exchange(double capacity_factor, bool all_to_one, bool padded = false) {
  const int64_t T = 64, k = 2, E = 4, D = 32, N = 48, align = 8;
  CudaBackend& be = dynamic_cast<CudaBackend&>(cuda_backend());
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::unique_ptr<NcclCommunicator> comm = NcclCommunicator::create(id, 1, 0, 0, "ep", {});
  OneRankServices services(be, *comm);

  Graph g;
  Builder b(g);
  ValueId ids = b.input("ids", {Shape{T, k}, DType::kI32});
  ValueId x = b.input("x", {Shape{T, D}, DType::kF32});
  ValueId w = b.input("w", {Shape{E, N, D}, DType::kF32});
  ops::DispatchPlan dp = ops::moe_dispatch_plan(b, ids, E, 1);
  ValueId xp = ops::moe_permute(b, x, dp);
  ops::EpLayout l =
      ops::ep_counts(b, dp.groups, MeshGroup::kEp, 1, align, T * k, capacity_factor, padded);
  ValueId xl = ops::ep_to_experts(b, xp, dp.groups, l, MeshGroup::kEp);
  ValueId yl = ops::grouped_matmul(b, xl, w, l.local_groups);
  ValueId yb = ops::ep_from_experts(b, yl, dp.groups, l, dp.capacity, MeshGroup::kEp);
  ValueId out = ops::moe_combine(b, yb, dp.row_map);
  g.mark_output(out);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<int32_t> idv(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      idv[size_t(t * k + j)] = all_to_one ? 0 : int32_t((t * 7 + j * 3 + (t / 5)) % E);
  if (all_to_one)  // top-k picks distinct experts: the second choice goes to expert 1
    for (int64_t t = 0; t < T; ++t) idv[size_t(t * k + 1)] = 1;
  std::vector<float> xv(size_t(T * D)), wv(size_t(E * N * D));
  for (float& v : xv) v = u(rng);
  for (float& v : wv) v = u(rng);

  Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, &services);
  ex.prepare();
  Stream& s0 = be.stream(0);
  auto up = [&](ValueId v, const Tensor& h) {
    be.copy(ex.tensor(v).raw(), h.raw(), h.nbytes(), CopyKind::kHostToDevice, s0);
  };
  up(ids, Tensor::from_vector(idv, Shape{T, k}));
  up(x, Tensor::from_vector(xv, Shape{T, D}));
  up(w, Tensor::from_vector(wv, Shape{E, N, D}));
  be.synchronize();
  ex.run();
  be.synchronize();
  Result r;
  const int64_t allocs = allocation_count(), mallocs = be.device_malloc_count();
  for (int i = 0; i < 3; ++i) ex.run();
  be.synchronize();
  r.allocs_after_first = allocation_count() - allocs;
  r.mallocs_after_first = be.device_malloc_count() - mallocs;
  if (padded) {
    Tensor counter = to_host(be, ops::ep_overflow_counter(g));
    r.padded_overflows = counter.data<float>()[0];
  }
  r.overflows = ex.row_capacity_stats().overflows;
  r.grows = ex.row_capacity_stats().grows;
  // Held: the host returns from run() before the stream does unless some node waits for it.
  hold_stream(s0, 300);
  const auto t0 = std::chrono::steady_clock::now();
  ex.run();
  r.held_run_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.stream_busy_after_held_run = cudaStreamQuery(native_stream(s0)) == cudaErrorNotReady;
  be.synchronize();
  Tensor got = to_host(be, ex.tensor(out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = idv[size_t(t * k + j)];
        for (int64_t d = 0; d < D; ++d)
          want += double(xv[size_t(t * D + d)]) * double(wv[size_t((e * N + n) * D + d)]);
      }
      const double rel = std::abs(got.item_as_double(t * N + n) - want) / (1.0 + std::abs(want));
      r.worst_rel = std::max(r.worst_rel, rel);
    }
  return r;
}

TEST(CudaEpExchange, PinnedCountsAndNoAllocationAfterTheFirstStep) {
  const Result r = run_exchange(1.0, false);  // one rank at factor 1: the plan holds every row
  EXPECT_EQ(r.overflows, 0);
  EXPECT_EQ(r.allocs_after_first, 0);
  EXPECT_EQ(r.mallocs_after_first, 0);
  EXPECT_LT(r.worst_rel, 1e-4);
}

TEST(CudaEpExchange, OverflowTakesThePoolOnceAndStaysDropless) {
  const Result r = run_exchange(0.5, true);
  EXPECT_EQ(r.overflows, 4);  // every run needs more rows than planned
  EXPECT_EQ(r.grows, 1);      // grown in the first run, reused by the next three
  EXPECT_EQ(r.allocs_after_first, 0);
  EXPECT_EQ(r.mallocs_after_first, 0);
  EXPECT_LT(r.worst_rel, 1e-4);
}

TEST(CudaEpExchange, SyncedExchangeWaitsForTheStreamOncePerLayer) {
  // The control of the test below: the synced exchange's counts wait holds the host until the
  // sleeping host function has run (the nodes after it are launched later still).
  const Result r = run_exchange(1.0, false);
  EXPECT_GE(r.held_run_ms, 250.0);
}

TEST(CudaEpExchange, PaddedExchangeMatchesWithoutAHostWaitOrAllocation) {
  const Result r = run_exchange(2.0, false, true);
  EXPECT_EQ(r.padded_overflows, 0.f);
  EXPECT_LT(r.worst_rel, 1e-4);
  EXPECT_EQ(r.allocs_after_first, 0);
  EXPECT_EQ(r.mallocs_after_first, 0);
  EXPECT_LT(r.held_run_ms, 150.0);  // launched everything while the stream slept
  EXPECT_TRUE(r.stream_busy_after_held_run);
}

TEST(CudaEpExchange, PaddedExchangeCountsTheRowsThatDoNotFit) {
  // Every first choice to expert 0, every second to expert 1: 64 rows each against slots of
  // 1.0 × 128 / 4 = 32 rows. Two slots over in each of the four runs.
  const Result r = run_exchange(1.0, true, true);
  EXPECT_EQ(r.padded_overflows, 8.f);
}

TEST(CudaEpExchange, PaddedIndexMapsGathersAndCountsEqualTheCpuKernels) {
  const ops::EpPaddedKernels& gpu = ops::ep_padded_kernels(DeviceType::kCUDA);
  const ops::EpPaddedKernels& cpu = ops::ep_padded_kernels(DeviceType::kCPU);
  CudaBackend& be = dynamic_cast<CudaBackend&>(cuda_backend());
  Stream& st = be.stream(0);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int ep = 1 + int(rng() % 4);
    const int64_t el = 1 + int64_t(rng() % 3), E = ep * el;
    ops::EpPaddedShape s{.ep = ep,
                         .el = el,
                         .block_rows = 1 + int64_t(rng() % 12),
                         .slot_rows = 1 + int64_t(rng() % 16),
                         .compact_rows = 0};
    std::vector<int32_t> groups(size_t(2 * E)), recv(size_t(ep * el));
    int32_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      groups[size_t(e)] = at;
      groups[size_t(E + e)] = int32_t(rng() % 7);
      at += groups[size_t(E + e)];
    }
    s.compact_rows = at + int64_t(rng() % 3);
    for (int32_t& n : recv) n = int32_t(rng() % 7);
    Tensor dg = to_device(be, Tensor::from_vector(groups, Shape{2, E}));
    Tensor dr = to_device(be, Tensor::from_vector(recv, Shape{ep, el}));
    for (ops::EpRowMap map : {ops::EpRowMap::kCompactToBlocks, ops::EpRowMap::kBlocksToSlots,
                              ops::EpRowMap::kSlotsToBlocks, ops::EpRowMap::kBlocksToCompact}) {
      const int64_t rows = ops::ep_padded_rows(map, s);
      std::vector<int32_t> want(static_cast<size_t>(rows));
      cpu.index(map, s, groups.data(), recv.data(), want.data(), st);
      Tensor idx = Tensor::empty(Shape{std::max<int64_t>(rows, 1)}, DType::kI32, be.allocator());
      gpu.index(map, s, dg.data<int32_t>(), dr.data<int32_t>(), idx.data<int32_t>(), st);
      Tensor got = to_host(be, idx);
      for (int64_t d = 0; d < rows; ++d)
        ASSERT_EQ(got.data<int32_t>()[d], want[size_t(d)]) << "trial " << trial << " row " << d;
      // The gather of 3 floats per row (12 bytes: the 4-byte path) from a source of ids.
      int64_t src_rows = 1;
      for (int32_t i : want) src_rows = std::max<int64_t>(src_rows, int64_t(i) + 1);
      std::vector<float> src(static_cast<size_t>(src_rows * 3));
      std::iota(src.begin(), src.end(), 1.f);
      std::vector<float> gathered(static_cast<size_t>(rows * 3), -1.f);
      cpu.gather(gathered.data(), src.data(), want.data(), rows, 12, st);
      Tensor dsrc = to_device(be, Tensor::from_vector(src, Shape{src_rows * 3}));
      Tensor ddst =
          Tensor::empty(Shape{std::max<int64_t>(rows * 3, 1)}, DType::kF32, be.allocator());
      gpu.gather(ddst.raw(), dsrc.raw(), idx.data<int32_t>(), rows, 12, st);
      Tensor hdst = to_host(be, ddst);
      for (int64_t i = 0; i < rows * 3; ++i)
        ASSERT_EQ(hdst.data<float>()[i], gathered[size_t(i)]) << "trial " << trial;
    }
    float want_count = 0;
    cpu.count_overflows(s, groups.data(), recv.data(), &want_count, st);
    Tensor counter = to_device(be, Tensor::from_vector(std::vector<float>{0.f}, Shape{1}));
    gpu.count_overflows(s, dg.data<int32_t>(), dr.data<int32_t>(), counter.data<float>(), st);
    EXPECT_EQ(to_host(be, counter).data<float>()[0], want_count) << "trial " << trial;
  }
}

}  // namespace
}  // namespace meshtrain::cudatest
