// The tests' tiny job and a run of its steps (see tiny_job.h).
#include "common/tiny_job.h"

namespace meshtrain::testing {

std::vector<std::string> tiny_job_args(const TinyJob& job) {
  return {"--job.device",
          "cpu",
          "--model.flavor",
          "tiny",
          "--training.seq_len",
          "32",
          "--training.steps",
          std::to_string(job.steps),
          "--training.seed",
          std::to_string(job.seed),
          "--optimizer.lr",
          "3e-3",
          "--lr_scheduler.warmup_steps",
          std::to_string(job.warmup_steps),
          "--metrics.enable_jsonl",
          "false",
          "--job.dump_folder",
          job.dump_folder};
}

JobConfig tiny_job_config(const TinyJob& job,
                          const std::vector<std::vector<std::string>>& overrides) {
  std::vector<std::string> all = tiny_job_args(job);
  for (const auto& o : overrides) all.insert(all.end(), o.begin(), o.end());
  return parse_job_config("", all);
}

namespace {
void add_step(RunResult& r, const StepRecord& rec) {
  r.loss.push_back(rec.loss);
  r.grad_norm.push_back(rec.grad_norm);
  r.mtp_loss.push_back(rec.mtp_losses);
  r.expert_exchanges += rec.expert_exchanges;
  r.expert_overflows += rec.expert_overflows;
  r.padded_replays += rec.padded_replayed;
}
}  // namespace

RunResult run_steps(Trainer& t, int steps) {
  RunResult r;
  for (int s = 0; s < steps; ++s) add_step(r, t.step());
  t.wait_for_checkpoint();
  return r;
}

RunResult run_train(Trainer& t) {
  RunResult r;
  for (const StepRecord& rec : t.train()) add_step(r, rec);
  return r;
}

}  // namespace meshtrain::testing
