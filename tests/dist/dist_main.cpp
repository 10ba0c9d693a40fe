// main() of meshtrain_dist_comm_tests: one Runtime for the whole run, rank 0 prints gtest's
// report, other ranks print only their failures, and after every test all ranks agree on
// whether it failed anywhere, so the exit code is the same on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "dist_util.h"
#include "meshtrain/core/check.h"

namespace dist {
namespace {
meshtrain::Runtime* g_runtime = nullptr;
std::unique_ptr<meshtrain::Backend> g_cpu;

class RankFailurePrinter : public testing::EmptyTestEventListener {
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank(),
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};

// Every rank runs the same tests in the same order, so this collective always matches up.
class AgreeOnFailure : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0;
    auto flags = meshtrain::Tensor::empty(meshtrain::Shape{nranks()}, meshtrain::DType::kI32);
    auto mine = meshtrain::Tensor::from_vector<int32_t>({failed}, meshtrain::Shape{1});
    world().all_gather(mine, flags, stream());
    std::string bad;
    for (int p = 0; p < nranks(); ++p)
      if (flags.data<int32_t>()[p]) bad += fmt::format(" {}", p);
    if (!bad.empty() && !failed)
      ADD_FAILURE() << info.test_suite_name() << "." << info.name() << " failed on rank(s)" << bad;
    if (!bad.empty() && rank() == 0)
      std::fprintf(stderr, "[dist] %s.%s failed on rank(s)%s\n", info.test_suite_name(),
                   info.name(), bad.c_str());
  }
};
}  // namespace

meshtrain::Runtime& runtime() { return *g_runtime; }
meshtrain::Communicator& world() { return g_runtime->world(); }
meshtrain::Stream& stream() { return g_cpu->stream(0); }

uint64_t shared_fresh_seed() {
  auto t = meshtrain::Tensor::from_vector<int64_t>(
      {int64_t(std::chrono::steady_clock::now().time_since_epoch().count() & 0x7fffffff)},
      meshtrain::Shape{1});
  world().broadcast(t, 0, stream());
  return uint64_t(t.data<int64_t>()[0]);
}

}  // namespace dist

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int rc = 1;
  try {
    meshtrain::Runtime rt(&argc, &argv);
    dist::g_runtime = &rt;
    dist::g_cpu = meshtrain::create_backend("cpu", 0);
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    if (rt.rank() != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new dist::RankFailurePrinter);
    }
    listeners.Append(new dist::AgreeOnFailure);
    if (rt.rank() == 0)
      std::printf("[dist] %s, world %d\n", rt.launch().describe().c_str(), rt.world_size());
    int local = RUN_ALL_TESTS();
    auto t = meshtrain::Tensor::from_vector<int32_t>({local}, meshtrain::Shape{1});
    dist::world().all_reduce(t, meshtrain::ReduceOp::kMax, dist::stream());
    rc = t.data<int32_t>()[0];
    dist::g_cpu.reset();
    dist::g_runtime = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain_dist_comm_tests: %s\n", e.what());
    meshtrain::abort_all(1);
  }
  return rc;
}
