// Faults on one rank, in-process: a NaN gradient stops the run naming the step (and, with the debug
// key, the parameter), or is skipped leaving masters, moments and the Adam step untouched; the
// collective watchdog's record and its reading of peers' status files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::test_runtime;
using testing::tiny_job;

std::vector<std::vector<float>> optimizer_state(const Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const ParamGroup& g : t.params().groups())
    for (const Tensor* x : {&g.master, &g.exp_avg, &g.exp_avg_sq})
      out.emplace_back(x->data<float>(), x->data<float>() + x->numel());
  return out;
}

class Faults : public testing::TempDirTest {};

TEST_F(Faults, NonFiniteGradientStopsNamingTheStepAndTheParameter) {
  Trainer t(tiny_job({"--debug.inject_nan_step", "3", "--debug.find_nonfinite_gradient", "true",
                      "--job.dump_folder", dir_.string()}),
            test_runtime());
  t.step();
  t.step();
  const auto before = optimizer_state(t);
  const std::string m = testing::error_message<NonFiniteError>([&] { t.step(); });
  EXPECT_CONTAINS(m, "step 3: the gradient norm is not finite");
  EXPECT_CONTAINS(m, "the first parameter with a non-finite gradient is tok_embeddings.weight");
  EXPECT_CONTAINS(m, "The update was not applied");
  EXPECT_CONTAINS(m, "[training] skip_nonfinite_steps = true");
  EXPECT_EQ(optimizer_state(t), before) << "a stopped step must not touch the masters or moments";
}

TEST_F(Faults, SkippedStepLeavesMastersMomentsAndTheAdamStepUntouched) {
  Trainer t(tiny_job({"--debug.inject_nan_step", "3", "--training.skip_nonfinite_steps", "true",
                      "--checkpoint.enable", "true", "--checkpoint.interval", "4",
                      "--checkpoint.last_save_model_only", "false", "--training.steps", "4",
                      "--job.dump_folder", dir_.string()}),
            test_runtime());
  EXPECT_FALSE(t.step().skipped);
  EXPECT_FALSE(t.step().skipped);
  const auto before = optimizer_state(t);
  const StepRecord r = t.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(std::isnan(r.grad_norm));
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_EQ(optimizer_state(t), before) << "a skipped step must leave masters and moments";
  const StepRecord r4 = t.step();
  EXPECT_FALSE(r4.skipped);
  EXPECT_NE(optimizer_state(t), before) << "the step after a skip updates again";
  t.wait_for_checkpoint();
  // Four steps, three updates: the checkpoint's AdamW step (bias correction) is 3.
  const std::string index = read_text_file((dir_ / "checkpoint/step-4/index.json").string());
  EXPECT_TRUE(std::regex_search(index, std::regex("\"optimizer_step\": ?3\\b"))) << index;
  EXPECT_TRUE(std::regex_search(index, std::regex("\"step\": ?4\\b"))) << index;
}

TEST_F(Faults, ConsecutiveSkipsStopAtTheLimit) {
  Trainer t(tiny_job({"--debug.inject_nan_step", "2", "--training.skip_nonfinite_steps", "true",
                      "--training.max_consecutive_skipped_steps", "1", "--job.dump_folder",
                      dir_.string()}),
            test_runtime());
  t.step();
  EXPECT_CONTAINS(testing::error_message<NonFiniteError>([&] { t.step(); }),
                  "1 non-finite steps in a row reached [training] max_consecutive_skipped_steps");
}

TEST(CollectiveWatchdog, RecordsTheCollectiveInFlight) {
  EXPECT_EQ(collective_in_flight(), "");
  watchdog_set_step(7);
  {
    CollectiveScope outer("all_gather", "fsdp");
    CollectiveScope inner("all_reduce", "world");  // nested: the outer one is what waits
    EXPECT_CONTAINS(collective_in_flight(), "all_gather on 'fsdp' at step 7");
  }
  EXPECT_EQ(collective_in_flight(), "");
  watchdog_set_step(0);
}

TEST_F(Faults, WatchdogNamesLostStalledAndGivenUpPeers) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that is gone
  auto status = [&](int rank, long pid, const std::string& op, const std::string& group) {
    std::ofstream(dir_ / fmt::format("rank-{}", rank))
        << host << " " << pid << " 5 " << op << " " << group << " 10 3\n";
  };
  status(1, long(getpid()), "-", "-");              // alive, in no collective: stalled
  status(2, long(getpid()), "all_to_all_v", "ep");  // alive, elsewhere
  bool lost = true;
  std::string d = describe_peers(dir_.string(), 0, 4, "all_gather", "fsdp", &lost);
  EXPECT_FALSE(lost);
  EXPECT_CONTAINS(d, fmt::format("rank 1 (pid {} on {}) is alive but in no collective (at step "
                                 "5): stalled",
                                 getpid(), host));
  EXPECT_CONTAINS(d, "rank 2 waits in all_to_all_v on 'ep' at step 5");
  status(3, long(child), "all_gather", "fsdp");
  d = describe_peers(dir_.string(), 0, 4, "all_gather", "fsdp", &lost);
  EXPECT_TRUE(lost);
  EXPECT_EQ(d, fmt::format("rank 3 (pid {} on {}) is gone: killed or crashed", child, host));
  status(3, long(getpid()), "gave_up", "-");
  d = describe_peers(dir_.string(), 0, 4, "all_gather", "fsdp", &lost);
  EXPECT_TRUE(lost);
  EXPECT_CONTAINS(d, "rank 3 gave up on its own collective");
  EXPECT_CONTAINS(d, "rank 1 (pid");
}

// What NCCL's asynchronous-error path reports: the peers known gone, from the running watchdog's
// status files; nothing (after the bounded wait) while every peer is alive or unknown.
TEST_F(Faults, LostPeersAreNamedFromTheWatchdogStatusFiles) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  start_collective_watchdog({.rank = 0, .world_size = 3, .status_dir = dir_.string()});
  EXPECT_EQ(describe_lost_peers(0.2), "");
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  std::ofstream(dir_ / "rank-1") << host << " " << getpid() << " 5 - - 10 3\n";  // alive
  std::ofstream(dir_ / "rank-2") << host << " " << child << " 5 - - 10 3\n";     // gone
  EXPECT_EQ(describe_lost_peers(0.2),
            fmt::format("rank 2 (pid {} on {}) is gone: killed or crashed", child, host));
  stop_collective_watchdog();
}

}  // namespace
}  // namespace meshtrain
