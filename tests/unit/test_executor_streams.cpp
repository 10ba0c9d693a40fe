// The executor's cross-stream ordering, on a recording backend: a consumer on another stream
// waits for an event recorded after its producer, and a block that reuses arena bytes waits
// for the last reader of the previous occupant on another stream.
#include <gtest/gtest.h>

#include <cstring>

#include "meshtrain/graph/executor.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {
namespace {

struct Log {
  std::vector<std::string> lines;
};

class RecStream final : public Stream {
 public:
  explicit RecStream(int id) : id(id) {}
  void* native_handle() const override { return nullptr; }
  void synchronize() override {}
  int id;
};

class RecEvent final : public Event {
 public:
  RecEvent(Log& log, int id) : log_(log), id_(id) {}
  void record(Stream& s) override {
    log_.lines.push_back(fmt::format("record e{} s{}", id_, static_cast<RecStream&>(s).id));
  }
  void wait(Stream& s) override {
    log_.lines.push_back(fmt::format("wait e{} s{}", id_, static_cast<RecStream&>(s).id));
  }
  void synchronize() override {}
  float elapsed_ms(const Event&) const override { return 0; }

 private:
  Log& log_;
  int id_;
};

class RecBackend final : public Backend {
 public:
  explicit RecBackend(Log& log) : log_(log) { ensure_streams(1); }
  Device device() const override { return {DeviceType::kCPU, 0}; }
  Allocator& allocator() override { return cpu_allocator(); }
  Allocator& host_staging_allocator() override { return cpu_allocator(); }
  Stream& stream(int i) override { return *streams_.at(size_t(i)); }
  int num_streams() const override { return int(streams_.size()); }
  void ensure_streams(int n) override {
    while (int(streams_.size()) < n)
      streams_.push_back(std::make_unique<RecStream>(int(streams_.size())));
  }
  std::unique_ptr<Event> create_event(bool) override {
    return std::make_unique<RecEvent>(log_, next_++);
  }
  void copy(void* d, const void* s, size_t n, CopyKind, Stream&) override { std::memcpy(d, s, n); }
  void fill_zero(void* d, size_t n, Stream&) override { std::memset(d, 0, n); }
  void synchronize() override {}
  std::string description() const override { return "recording"; }
  int64_t memory_capacity() const override { return 1; }
  double peak_flops(DType) const override { return 0; }

 private:
  Log& log_;
  std::vector<std::unique_ptr<RecStream>> streams_;
  int next_ = 0;
};

class LogObserver final : public NodeObserver {
 public:
  explicit LogObserver(Log& log) : log_(log) {}
  void before(const Node& n, Stream& s) override {
    log_.lines.push_back(
        fmt::format("run {} s{}", n.attrs.s("tag", n.op), static_cast<RecStream&>(s).id));
  }
  void after(const Node&, Stream&) override {}

 private:
  Log& log_;
};

size_t find(const Log& log, const std::string& line) {
  for (size_t i = 0; i < log.lines.size(); ++i)
    if (log.lines[i] == line) return i;
  ADD_FAILURE() << "missing log line: " << line;
  return log.lines.size();
}

// x -> producer = 2x [stream 1] -> consumer = 3 · producer [stream 0], prepared on a recording
// backend whose log also records every node run.
struct ProducerConsumer {
  Graph g;
  ValueId x = kNoValue, c = kNoValue;
  Log log;
  RecBackend be{log};
  LogObserver obs{log};
  std::unique_ptr<Executor> ex;
  ProducerConsumer() {
    Builder b(g);
    x = b.input("x", {Shape{64}, DType::kF32});
    ValueId a = b.op1("scale", {x}, {{"factor", 2.0}, {"tag", "producer"}});
    g.node(g.value(a).producer).stream = 1;
    c = b.op1("scale", {a}, {{"factor", 3.0}, {"tag", "consumer"}});
    g.mark_output(c);
    ex = std::make_unique<Executor>(g, plan_memory(g, DeviceType::kCPU), be, nullptr);
    ex->prepare();
    ex->set_observer(&obs);
  }
};

TEST(ExecutorStreams, ConsumerOnAnotherStreamWaitsForItsProducer) {
  ProducerConsumer pc;
  Log& log = pc.log;
  Executor& ex = *pc.ex;
  const ValueId x = pc.x, c = pc.c;
  ex.tensor(x).data<float>()[0] = 1.0f;
  ex.run();
  size_t prod = find(log, "run producer s1"), rec = find(log, "record e0 s1");
  size_t wait = find(log, "wait e0 s0"), cons = find(log, "run consumer s0");
  EXPECT_LT(prod, rec);
  EXPECT_LT(rec, wait);
  EXPECT_LT(wait, cons);
  EXPECT_EQ(ex.tensor(c).data<float>()[0], 6.0f);
}

TEST(ExecutorStreams, RunsBackToBackAreOrderedAsWholesOnStreamZero) {
  // Two runs of producer [s1] -> consumer [s0]: the second run's producer must not start before
  // the first run's work on stream 0 (it would overwrite arena bytes still read there), and
  // stream 0 must not go on before the first run's stream-1 work ends.
  ProducerConsumer pc;
  pc.ex->run();
  pc.ex->run();
  const Log& log = pc.log;
  // Events: e0 orders producer -> consumer; e1 marks a run's start on s0; e2 s1's end.
  std::vector<std::string> want = {"record e1 s0", "wait e1 s1", "run producer s1",
                                   "record e0 s1", "wait e0 s0", "run consumer s0",
                                   "record e2 s1", "wait e2 s0"};
  std::vector<std::string> got;
  for (const std::string& l : log.lines)
    if (l.rfind("record", 0) == 0 || l.rfind("wait", 0) == 0 || l.rfind("run", 0) == 0)
      got.push_back(l);
  std::vector<std::string> twice = want;
  twice.insert(twice.end(), want.begin(), want.end());
  EXPECT_EQ(got, twice);
}

TEST(ExecutorStreams, ArenaReuseAcrossStreamsWaitsForTheLastReader) {
  // t1 = scale(x) [s0]; r = scale(t1) [s1] (last reader of t1, on stream 1); t1's bytes are
  // then free, and t2 = scale(x) [s0], planned into them, must wait for r.
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{1024}, DType::kF32});
  ValueId t1 = b.op1("scale", {x}, {{"factor", 1.0}, {"tag", "t1"}});
  ValueId r = b.op1("sum", {t1}, {{"tag", "reader"}});
  g.node(g.value(r).producer).stream = 1;
  ValueId t2 = b.op1("scale", {x}, {{"factor", 1.0}, {"tag", "t2"}});
  ValueId out = b.op1("sum", {t2}, {{"tag", "out"}});
  g.mark_output(r);
  g.mark_output(out);
  MemoryPlan plan = plan_memory(g, DeviceType::kCPU);
  ASSERT_EQ(plan.offset[size_t(t1)], plan.offset[size_t(t2)]) << "the plan reuses t1's bytes";
  Log log;
  RecBackend be(log);
  Executor ex(g, std::move(plan), be, nullptr);
  ex.prepare();
  LogObserver obs(log);
  ex.set_observer(&obs);
  ex.run();
  size_t reader = find(log, "run reader s1");
  size_t t2_run = find(log, "run t2 s0");
  bool waited = false;
  for (size_t i = reader; i < t2_run; ++i) waited |= log.lines[i].rfind("wait", 0) == 0;
  EXPECT_TRUE(waited) << "t2 overwrote t1's bytes without waiting for the stream-1 reader";
}

}  // namespace
}  // namespace meshtrain
