// Whole runs with compute copies (CPU, float64 masters, float32 compute) against the cast path
// ([training] compute_weight_copies = false, what every mixed-precision run did before the copies):
// the same losses, gradient norms and masters bit for bit over several steps, after a resume from
// a checkpoint, after an HF initial load and in a validation pass; a skipped step keeps the
// copies; every copy equals cast(master) whenever a step is about to read it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validator.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::test_runtime;

const std::vector<std::string> kMixed = {"--training.master_dtype", "float64",
                                         "--training.mixed_precision_param", "float32"};
const std::vector<std::string> kCastPath = {"--training.compute_weight_copies", "false"};
const std::vector<std::string> kDeepSeek = {"--model.name", "deepseek_v3",      "--model.flavor",
                                            "debugmodel",   "--model.n_layers", "2"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Record {
  std::vector<double> loss, norm;
};

// Every compute copy equals float(master), bit for bit (the CPU store's tensors are host memory).
void expect_copies_follow_masters(const Trainer& t, const std::string& when) {
  int copies = 0;
  for (const ParamInfo& p : t.plan().params()) {
    if (p.compute == kNoValue) continue;
    ++copies;
    const Tensor m = t.params().master(p.name), c = t.params().compute_copy(p.name);
    for (int64_t i = 0; i < m.numel(); ++i) {
      const float want = float(m.data<double>()[i]);
      if (std::memcmp(&want, c.data<float>() + i, 4) != 0) {
        ADD_FAILURE() << when << ": " << p.name << "[" << i << "] copy " << c.data<float>()[i]
                      << ", cast(master) " << want;
        return;
      }
    }
  }
  EXPECT_GT(copies, 0) << when;
}

Record run(Trainer& t, int steps, bool copies) {
  Record r;
  for (int i = 0; i < steps; ++i) {
    const StepRecord s = t.step();
    r.loss.push_back(s.loss);
    r.norm.push_back(s.grad_norm);
    if (copies) expect_copies_follow_masters(t, fmt::format("after step {}", s.step));
  }
  t.wait_for_checkpoint();
  return r;
}

std::vector<std::vector<double>> masters(const Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const ParamInfo& p : t.plan().params())
    if (p.trainable) out.push_back(t.params().master_to_host(p.name).to_vector<double>());
  return out;
}

void expect_bitwise(const Record& a, const Record& b, size_t from_b, const std::string& what) {
  ASSERT_LE(a.loss.size() + from_b, b.loss.size()) << what;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_EQ(a.loss[i], b.loss[i + from_b]) << what << ": loss of step " << i + from_b + 1;
    EXPECT_EQ(a.norm[i], b.norm[i + from_b]) << what << ": grad norm of step " << i + from_b + 1;
  }
}

class ComputeCopyRuns : public testing::TempDirTest {
 protected:
  JobConfig job(const std::string& name, const std::vector<std::string>& extra) {
    return testing::tiny_job(
        cat(cat({"--job.dump_folder", (dir_ / name).string()}, kMixed), extra));
  }
};

TEST_F(ComputeCopyRuns, TrainingIsBitwiseTheCastPath) {
  for (const auto& model : {std::vector<std::string>{}, kDeepSeek}) {
    const std::string tag = model.empty() ? "llama3" : "deepseek_v3";
    Trainer copies(job(tag + "_copies", cat(model, {"--training.steps", "5"})), test_runtime());
    EXPECT_TRUE(copies.params().has_compute_copies());
    expect_copies_follow_masters(copies, tag + " after start-up");
    const Record a = run(copies, 5, true);
    Trainer cast(job(tag + "_cast", cat(cat(model, kCastPath), {"--training.steps", "5"})),
                 test_runtime());
    EXPECT_FALSE(cast.params().has_compute_copies());
    const Record b = run(cast, 5, false);
    expect_bitwise(a, b, 0, tag);
    EXPECT_EQ(masters(copies), masters(cast)) << tag;
  }
}

TEST_F(ComputeCopyRuns, ResumeContinuesBitwiseAsTheCastPath) {
  // The uninterrupted cast-path run, and a copies run cut after step 4 and resumed: the resumed
  // run's copies must be cast from the loaded masters, not left from the seeded ones.
  const std::vector<std::string> ckpt = {"--training.steps",
                                         "6",
                                         "--checkpoint.enable",
                                         "true",
                                         "--checkpoint.interval",
                                         "4",
                                         "--checkpoint.last_save_model_only",
                                         "false"};
  Record whole;
  {
    Trainer t(job("whole", cat(kCastPath, ckpt)), test_runtime());
    whole = run(t, 6, false);
  }
  {
    Trainer t(job("cut", ckpt), test_runtime());
    run(t, 4, true);
  }
  Trainer t(job("cut", ckpt), test_runtime());
  ASSERT_TRUE(t.resumed().loaded);
  ASSERT_EQ(t.resumed().step, 4);
  expect_copies_follow_masters(t, "after the resume");
  expect_bitwise(run(t, 2, true), whole, 4, "resumed");
}

TEST_F(ComputeCopyRuns, HfInitialLoadStartsBitwiseAsTheCastPath) {
  // Final weights of a short run in HF layout; two runs start from them, with copies and cast.
  {
    Trainer t(job("src", cat(kDeepSeek, {"--training.steps", "3", "--checkpoint.enable", "true",
                                         "--checkpoint.last_save_in_hf", "true",
                                         "--checkpoint.interval", "100"})),
              test_runtime());
    run(t, 3, true);
  }
  const fs::path hf = dir_ / "src" / "checkpoint" / "step-3";
  ASSERT_TRUE(fs::exists(hf / "model.safetensors.index.json")) << hf;
  const std::vector<std::string> load = {"--checkpoint.enable",
                                         "true",
                                         "--checkpoint.initial_load_path",
                                         hf.string(),
                                         "--checkpoint.initial_load_in_hf",
                                         "true",
                                         "--training.steps",
                                         "3"};
  Trainer copies(job("copies", cat(kDeepSeek, load)), test_runtime());
  expect_copies_follow_masters(copies, "after the HF load");
  const Record a = run(copies, 3, true);
  Trainer cast(job("cast", cat(cat(kDeepSeek, kCastPath), load)), test_runtime());
  expect_bitwise(a, run(cast, 3, false), 0, "HF load");
}

TEST_F(ComputeCopyRuns, SkippedStepKeepsTheCopies) {
  Trainer t(
      job("skip", {"--debug.inject_nan_step", "2", "--training.skip_nonfinite_steps", "true"}),
      test_runtime());
  t.step();
  std::vector<std::vector<float>> before;
  for (const ParamInfo& p : t.plan().params())
    if (p.compute != kNoValue) before.push_back(t.params().compute_copy(p.name).to_vector<float>());
  EXPECT_TRUE(t.step().skipped);
  size_t k = 0;
  for (const ParamInfo& p : t.plan().params())
    if (p.compute != kNoValue)
      EXPECT_EQ(t.params().compute_copy(p.name).to_vector<float>(), before[k++]) << p.name;
  EXPECT_FALSE(t.step().skipped);
  expect_copies_follow_masters(t, "after the step that follows the skip");
}

TEST_F(ComputeCopyRuns, ValidationReadsTheCopies) {
  const std::string held_out = write("held_out.txt", [] {
    std::string t;
    for (int i = 0; i < 40; ++i) t += fmt::format("Held-out document {} about nothing.\n\n", i);
    return t;
  }());
  const std::vector<std::string> val = {
      "--validation.enable",           "true",   "--validation.dataset", "text",
      "--validation.dataset_path",     held_out, "--validation.seq_len", "32",
      "--validation.local_batch_size", "2",      "--validation.steps",   "2"};
  double loss[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    Trainer t(job(k ? "cast" : "copies",
                  cat(cat(kDeepSeek, val), k ? kCastPath : std::vector<std::string>{})),
              test_runtime());
    run(t, 2, k == 0);
    ASSERT_NE(t.validator(), nullptr);
    loss[k] = t.validator()->run(2).loss;
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_TRUE(std::isfinite(loss[0]));
}

}  // namespace
}  // namespace meshtrain
