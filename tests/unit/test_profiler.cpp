// The profiler end to end on the CPU backend: profiled steps write a Chrome trace that parses as
// JSON and holds one complete event per scheduled node (per micro-batch), on named tracks;
// steps that are not profiled write nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "meshtrain/graph/passes/assign_streams.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::test_runtime;
using testing::tiny_job;

class ProfilerTest : public testing::TempDirTest {
 protected:
  JobConfig job(std::vector<std::string> extra) {
    std::vector<std::string> o = {"--job.dump_folder",
                                  dir_.string(),
                                  "--profiling.enable_profiling",
                                  "true",
                                  "--profiling.profile_freq",
                                  "2",
                                  "--training.steps",
                                  "2"};
    o.insert(o.end(), extra.begin(), extra.end());
    return tiny_job(o);
  }
  nlohmann::json read_trace(int64_t step) {
    std::filesystem::path p =
        dir_ / "profile_traces" / fmt::format("iteration_{}", step) / "rank0_trace.json";
    EXPECT_TRUE(std::filesystem::exists(p)) << p;
    std::ifstream in(p);
    return nlohmann::json::parse(in);  // throws (fails the test) on malformed JSON
  }
};

void expect_one_event_per_node(const nlohmann::json& trace, const Executor& exec, int runs) {
  const Graph& g = exec.graph();
  const std::vector<NodeId>& schedule = exec.plan().schedule;
  std::map<std::pair<int, int64_t>, std::string> seen;  // (micro-batch, node) -> op
  std::map<int, std::string> tracks;
  int complete = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      tracks[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    if (e.at("ph") != "X") continue;
    ++complete;
    const auto& a = e.at("args");
    const int64_t node = a.at("node").get<int64_t>();
    const int mb = a.at("micro_batch").get<int>();
    EXPECT_EQ(e.at("name").get<std::string>(), g.node(NodeId(node)).op) << "node " << node;
    EXPECT_EQ(a.at("scope").get<std::string>(), g.node(NodeId(node)).scope);
    EXPECT_FALSE(a.at("shapes").get<std::string>().empty());
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    EXPECT_GE(e.at("ts").get<double>(), 0.0);
    EXPECT_TRUE(seen.emplace(std::make_pair(mb, node), e.at("name").get<std::string>()).second)
        << "node " << node << " appears twice in micro-batch " << mb;
  }
  EXPECT_EQ(complete, int(schedule.size()) * runs);
  for (int mb = 0; mb < runs; ++mb)
    for (NodeId id : schedule)
      EXPECT_TRUE(seen.count({mb, id})) << "node " << id << " (" << g.node(id).op << ") missing";
  ASSERT_TRUE(tracks.count(0));
  EXPECT_EQ(tracks[0], "compute");
}

TEST_F(ProfilerTest, ProfiledStepWritesOneEventPerScheduledNode) {
  Trainer t(job({}), test_runtime());
  t.step();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "profile_traces" / "iteration_1"))
      << "step 1 is not a multiple of profile_freq 2";
  t.step();
  nlohmann::json trace = read_trace(2);
  expect_one_event_per_node(trace, t.executor(), 1);
  EXPECT_EQ(trace.at("otherData").at("step").get<int64_t>(), 2);
}

TEST_F(ProfilerTest, EveryMicroBatchIsRecorded) {
  Trainer t(job({"--training.global_batch_size", "4"}), test_runtime());  // 2 micro-batches
  t.step();
  t.step();
  expect_one_event_per_node(read_trace(2), t.executor(), 2);
}

TEST(Profiler, CommunicationTracksAreNamedByTheirMeshGroup) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{4}, DType::kF32});
  ValueId y = ops::all_reduce(b, ops::scale(b, x, 2.0), MeshGroup::kFsdp);
  g.mark_output(ops::all_reduce(b, y, MeshGroup::kTp));
  const std::map<MeshGroup, int> streams = assign_streams(g);
  auto be = create_backend("cpu", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *be, nullptr);
  ex.prepare();
  Profiler p(*be, ex, 1, 0);
  EXPECT_EQ(p.stream_name(0), "compute");
  EXPECT_EQ(p.stream_name(streams.at(MeshGroup::kFsdp)), "fsdp");
  EXPECT_EQ(p.stream_name(streams.at(MeshGroup::kTp)), "tp");
}

TEST_F(ProfilerTest, DisabledProfilingWritesNothing) {
  JobConfig cfg = job({"--profiling.enable_profiling", "false"});
  Trainer t(cfg, test_runtime());
  t.step();
  t.step();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "profile_traces"));
}

}  // namespace
}  // namespace meshtrain
