// Test helpers (see test_support.h).
#include "test_support.h"

#include <memory>

namespace meshtrain::testing {

Runtime& test_runtime() {
  static int argc = 1;
  static char name[] = "meshtrain_tests";
  static char* argv_storage[] = {name, nullptr};
  static char** argv = argv_storage;
  static std::unique_ptr<Runtime> rt = std::make_unique<Runtime>(&argc, &argv);
  return *rt;
}

JobConfig tiny_job(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {
      "--job.device", "cpu",           "--model.flavor",          "tiny",
      "--training.seq_len", "32",      "--training.local_batch_size", "2",
      "--training.steps", "4",         "--training.seed",         "7",
      "--optimizer.lr", "3e-3",        "--lr_scheduler.warmup_steps", "2",
      "--metrics.log_freq", "1",       "--metrics.enable_jsonl",  "false",
      "--job.dump_folder", "/tmp/meshtrain_test_outputs"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return parse_job_config("", all);
}

}  // namespace meshtrain::testing
