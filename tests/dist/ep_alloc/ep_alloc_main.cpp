// Expert parallel steps allocate nothing on the host or the device once the first step has run:
// no allocator call in the whole step (allocation_count) and no operator new inside the expert
// exchange's nodes (ep_counts, ep_to_experts, ep_from_experts: a node observer counts around
// them; the CPU reference kernels of other ops keep small host vectors, which is theirs to
// fix), across steps of the DeepSeek-V3 debug model under FSDP + EP. With --all-to-one the routing
// sends every token to one expert, so every exchange overflows its planned capacity: the first step
// grows the row-capacity pool (the one allowed allocation); later steps reuse it, or return to the
// planned arena when their load fits it, and neither allocates. Prints "EP ALLOC OK" on rank 0
// when every rank passes.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "../parity/parity_util.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/tensor/allocator.h"
#include "meshtrain/train/trainer.h"

namespace {
// Per thread: the node runs on the executing thread; other threads of the process (the collective
// watchdog writing its status file once a second) allocate on their own schedule and are not the
// exchange's allocations (counting them globally made the test fail at random).
thread_local bool g_counting = false;
std::atomic<int64_t> g_news{0};
}  // namespace

// Counting operator new: every C++ heap allocation of this process goes through these. They pair
// malloc with free, which GCC cannot see through (-Wmismatched-new-delete is a false alarm here).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace meshtrain;

namespace {
// Counts operator new only while an expert-exchange node runs.
class ExchangeNews : public NodeObserver {
 public:
  int64_t nodes = 0;
  void before(const Node& n, Stream&) override {
    if (n.op.rfind("ep_", 0) == 0) {
      ++nodes;
      g_counting = true;
    }
  }
  void after(const Node&, Stream&) override { g_counting = false; }
};
}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) extra.push_back(argv[i]);
  Communicator& world = rt.world();
  std::unique_ptr<Backend> host = create_backend("cpu", 0);
  int failures = 0;
  try {
    JobConfig cfg = testing::harness_job(5, {extra});
    Trainer t(cfg, world, rt.launch());
    t.step();
    const int64_t allocs = allocation_count();
    int64_t exchanges = 0, overflows = 0;
    g_news = 0;
    ExchangeNews obs;
    t.executor().set_observer(&obs);
    for (int s = 0; s < 3; ++s) {
      StepRecord r = t.step();
      exchanges += r.expert_exchanges;
      overflows += r.expert_overflows;
    }
    t.executor().set_observer(nullptr);
    const int64_t news = g_news.load(), new_allocs = allocation_count() - allocs;
    std::printf(
        "rank %d: %lld expert exchanges (%lld over the plan), %lld exchange nodes run; "
        "%lld allocator calls in the steps, %lld operator new calls in the exchange "
        "nodes (3 steps after the first)\n",
        world.rank(), (long long)exchanges, (long long)overflows, (long long)obs.nodes,
        (long long)new_allocs, (long long)news);
    if (exchanges == 0 || obs.nodes == 0 || new_allocs != 0 || news != 0) ++failures;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
    abort_all(2);
  }
  Tensor f = Tensor::from_vector(std::vector<int32_t>{failures}, Shape{1});
  world.all_reduce(f, ReduceOp::kSum, host->stream(0));
  if (world.rank() == 0)
    std::printf("%s\n", f.data<int32_t>()[0] == 0 ? "EP ALLOC OK" : "EP ALLOC FAILED");
  return f.data<int32_t>()[0] == 0 ? 0 : 1;
}
