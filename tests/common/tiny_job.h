// The tiny training job the unit, parity and validation tests run in-process: llama3 "tiny" on the
// CPU in float32, seq 32, lr 3e-3, no metrics.jsonl. Each test binary picks its steps, seed,
// warmup and dump folder; overrides in the command-line syntax come after and win. Also a run of
// logged steps of any trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/train/trainer.h"

namespace meshtrain::testing {

struct TinyJob {
  int64_t steps = 4;
  int64_t seed = 7;
  int64_t warmup_steps = 2;
  std::string dump_folder = "/tmp/meshtrain_test_outputs";
};

// The job's settings as --section.key arguments.
std::vector<std::string> tiny_job_args(const TinyJob& job);

// The parsed job: tiny_job_args(job), then each list of `overrides` in order.
JobConfig tiny_job_config(const TinyJob& job,
                          const std::vector<std::vector<std::string>>& overrides = {});

// What a run of logged steps reports, per step and summed over the steps.
struct RunResult {
  std::vector<double> loss, grad_norm;
  std::vector<std::vector<double>> mtp_loss;  // per step, each MTP depth's loss (empty without)
  int64_t expert_exchanges = 0, expert_overflows = 0;  // this rank's, over the steps
  int64_t padded_replays = 0;  // steps redone synced ([parallelism] expert_exchange = "padded")
};
// `steps` steps, each read back; then waits for a checkpoint save in flight.
RunResult run_steps(Trainer& t, int steps);
// Trainer::train() (where the update may overlap the next step): its logged steps.
RunResult run_train(Trainer& t);

}  // namespace meshtrain::testing
