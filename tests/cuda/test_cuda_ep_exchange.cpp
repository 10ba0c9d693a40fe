// The expert exchange on CUDA over a one-rank NCCL communicator: ep_counts copies its counts
// through the pinned host buffers made at prepare, the grouped GEMM reads the local groups that
// ep_counts published on the host (no copy, no wait of its own), and steps after the first
// allocate nothing on the host or the device. A planned capacity below the load (capacity factor
// 0.5, every token routed to one expert) takes the row-capacity pool: grown once, then reused,
// and the result still matches the host oracle (dropless).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda_test_util.h"
#include "meshtrain/comm/expert_exchange.h"
#include "meshtrain/comm/nccl/nccl_communicator.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/ops/grouped_matmul.h"
#include "meshtrain/ops/moe_combine.h"
#include "meshtrain/ops/moe_permute.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {
namespace {

class OneRankServices : public ExecServices {
 public:
  OneRankServices(Backend& be, Communicator& comm) : be_(be), comm_(comm) {}
  Communicator& comm(MeshGroup) override { return comm_; }
  Backend& backend() override { return be_; }

 private:
  Backend& be_;
  Communicator& comm_;
};

struct Result {
  int64_t overflows = 0, grows = 0, allocs_after_first = 0, mallocs_after_first = 0;
  double worst_rel = 0;
};

// T tokens, top-k over E experts, x [T, D] → y [T, N] = Σ_j x_t · w[e_tj]ᵀ through the exchange.
Result run_exchange(double capacity_factor, bool all_to_one) {
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
  ops::EpLayout l = ops::ep_counts(b, dp.groups, MeshGroup::kEp, 1, align, T * k, capacity_factor);
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
  r.overflows = ex.row_capacity_stats().overflows;
  r.grows = ex.row_capacity_stats().grows;
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

}  // namespace
}  // namespace meshtrain::cudatest
