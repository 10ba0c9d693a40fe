// Checkpoints through the trainer on one rank: bitwise resume (sync and async saves), the choice of
// checkpoint (latest, load_step, half-written ones never), keep_latest_k, exclude_from_loading,
// model-only exports, and every bad input with its message (another flavor, missing/extra
// tensors, truncation, corruption, checksums, dtypes, paths, a disk that fills mid-save).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/manager.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using testing::test_runtime;

using Record = testing::RunResult;
Record run(Trainer& t, int steps) { return testing::run_steps(t, steps); }

std::vector<std::vector<float>> masters(const Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const ParamInfo& p : t.plan().params())
    out.push_back(t.params().master_to_host(p.name).to_vector<float>());
  return out;
}

class CheckpointTest : public testing::TempDirTest {
 protected:
  // 8 steps, a full save every 4 (and at the last step), into dir_/<name>/checkpoint.
  JobConfig job(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {"--job.dump_folder",
                                  (dir_ / name).string(),
                                  "--training.steps",
                                  "8",
                                  "--checkpoint.enable",
                                  "true",
                                  "--checkpoint.interval",
                                  "4",
                                  "--checkpoint.last_save_model_only",
                                  "false"};
    o.insert(o.end(), extra.begin(), extra.end());
    return testing::tiny_job(o);
  }
  std::string step_dir(const std::string& name, int step) {
    return (dir_ / name / "checkpoint" / fmt::format("step-{}", step)).string();
  }
  // Saves step-4 of run `name` (a run of 8 steps stopped after 4).
  void save_step4(const std::string& name, std::vector<std::string> extra = {}) {
    Trainer t(job(name, extra), test_runtime());
    run(t, 4);
  }
  static nlohmann::json read_json(const std::string& path) {
    return nlohmann::json::parse(read_text_file(path));
  }
  static void write_json(const std::string& path, const nlohmann::json& j) {
    std::ofstream(path, std::ios::trunc) << j.dump(1);
  }
  std::string load_error(const JobConfig& cfg) {
    return error_message<Error>([&] { Trainer t(cfg, test_runtime()); });
  }
};

class ResumeTest : public CheckpointTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ResumeTest, ContinuesBitwiseAsTheUninterruptedRun) {
  const std::vector<std::string> mode = {"--checkpoint.async_mode", GetParam()};
  Record whole;
  std::vector<std::vector<float>> want;
  {
    Trainer t(job("whole", mode), test_runtime());
    EXPECT_FALSE(t.resumed().loaded);
    whole = run(t, 8);
    want = masters(t);
  }
  save_step4("cut", mode);
  ASSERT_TRUE(fs::exists(fs::path(step_dir("cut", 4)) / "index.json"));
  Trainer t(job("cut", mode), test_runtime());  // no extra flags: the folder's latest
  EXPECT_TRUE(t.resumed().loaded);
  EXPECT_EQ(t.resumed().step, 4);
  EXPECT_EQ(t.steps_done(), 4);
  Record rest = run(t, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rest.loss[size_t(i)], whole.loss[size_t(i) + 4]) << "step " << i + 5;
    EXPECT_EQ(rest.grad_norm[size_t(i)], whole.grad_norm[size_t(i) + 4]) << "step " << i + 5;
  }
  EXPECT_EQ(masters(t), want);
  EXPECT_TRUE(fs::exists(fs::path(step_dir("cut", 8)) / "index.json"));
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ResumeTest, ::testing::Values("disabled", "async"));

TEST_F(CheckpointTest, HalfWrittenCheckpointsAreNeverPicked) {
  save_step4("run");
  fs::create_directories(step_dir("run", 6));  // a step folder without its index
  fs::create_directories(dir_ / "run" / "checkpoint" / ".step-8.tmp");  // a save that died
  EXPECT_EQ(list_checkpoints((dir_ / "run" / "checkpoint").string()), std::vector<int64_t>{4});
  Trainer t(job("run"), test_runtime());
  EXPECT_EQ(t.resumed().step, 4);
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoint" / ".step-8.tmp"));
}

TEST_F(CheckpointTest, LoadStepPicksAnOlderOneAndNothingIsOverwritten) {
  {
    Trainer t(job("run", {"--checkpoint.interval", "2"}), test_runtime());
    run(t, 4);  // step-2, step-4
  }
  Trainer t(job("other", {"--checkpoint.initial_load_path", step_dir("run", 2),
                          "--checkpoint.initial_load_model_only", "false"}),
            test_runtime());
  EXPECT_EQ(t.resumed().step, 2);
  EXPECT_CONTAINS(
      load_error(job("run", {"--checkpoint.interval", "2", "--checkpoint.load_step", "2"})),
      "already holds checkpoint step-4, which this run (starting at step 2) would "
      "save again");
  EXPECT_CONTAINS(load_error(job("run", {"--checkpoint.load_step", "3"})),
                  "load_step = 3: " + (dir_ / "run" / "checkpoint").string() +
                      " holds no complete checkpoint step-3 (it holds step 2, step 4)");
}

TEST_F(CheckpointTest, KeepLatestKDeletesOnlyOlderCompleteOnes) {
  Trainer t(job("run", {"--checkpoint.interval", "2", "--checkpoint.keep_latest_k", "2"}),
            test_runtime());
  run(t, 8);
  EXPECT_EQ(list_checkpoints((dir_ / "run" / "checkpoint").string()), (std::vector<int64_t>{6, 8}));
}

TEST_F(CheckpointTest, ExcludedPartsStartFresh) {
  save_step4("run");
  Trainer a(job("a", {"--checkpoint.initial_load_path", step_dir("run", 4),
                      "--checkpoint.initial_load_model_only", "false",
                      "--checkpoint.exclude_from_loading", "optimizer, train_state"}),
            test_runtime());
  EXPECT_EQ(a.resumed().step, 0);
  EXPECT_EQ(a.resumed().optimizer_step, 0);
  EXPECT_EQ(a.resumed().lr_step, 4);
  const ParamInfo& p = a.plan().params()[0];
  Tensor m = Tensor::empty(p.local_shape, p.dtype);
  m.copy_from_host(a.params().master_to_host(p.name));
  EXPECT_NE(m.item_as_double(0), 0.0);  // the weights are the checkpoint's
  Trainer b(job("b", {"--checkpoint.initial_load_path", step_dir("run", 4)}), test_runtime());
  EXPECT_TRUE(b.resumed().loaded);  // initial_load_model_only (the default): weights only
  EXPECT_EQ(b.resumed().step, 0);
  EXPECT_EQ(b.resumed().lr_step, 0);
}

TEST_F(CheckpointTest, ModelOnlyLastSaveInExportDtype) {
  std::vector<std::vector<float>> src;
  {
    Trainer t(job("run", {"--checkpoint.last_save_model_only", "true", "--checkpoint.export_dtype",
                          "bfloat16"}),
              test_runtime());
    run(t, 8);
    src = masters(t);
  }
  const nlohmann::json ix = read_json(step_dir("run", 8) + "/index.json");
  EXPECT_TRUE(ix["model_only"].get<bool>());
  EXPECT_EQ(ix["tensors"][0]["dtype"], "BF16");
  EXPECT_EQ(ix["tensors"].size(), src.size());  // no optimizer state
  EXPECT_CONTAINS(load_error(job("other", {"--checkpoint.initial_load_path", step_dir("run", 8),
                                           "--checkpoint.initial_load_model_only", "false"})),
                  "holds only model weights (saved with last_save_model_only = true)");
  Trainer t(job("other", {"--checkpoint.initial_load_path", step_dir("run", 8)}), test_runtime());
  std::vector<std::vector<float>> got = masters(t);
  ASSERT_EQ(got.size(), src.size());
  for (size_t i = 0; i < src.size(); ++i)
    for (size_t k = 0; k < src[i].size(); ++k)
      ASSERT_EQ(got[i][k], float(BFloat16(src[i][k]))) << i << " " << k;
}

TEST_F(CheckpointTest, AnotherModelOrFlavorNamesTheFirstTensorThatDiffers) {
  save_step4("run");
  const std::string from = step_dir("run", 4);
  auto load = [&](std::vector<std::string> o) {
    o.insert(o.end(), {"--checkpoint.initial_load_path", from});
    return load_error(job("x", o));
  };
  EXPECT_CONTAINS(load({"--model.flavor", "debugmodel"}),
                  "checkpoint " + from +
                      " does not fit this model (another model or flavor?): tensor "
                      "tok_embeddings.weight has shape [258, 40] in the checkpoint and [258, 256] "
                      "in this model");
  EXPECT_CONTAINS(load({"--model.n_layers", "3"}), "lacks tensor layers.2.attention_norm.weight");
  EXPECT_CONTAINS(load({"--model.n_layers", "1"}),
                  "holds tensor layers.1.attention_norm.weight (and ");
}

TEST_F(CheckpointTest, DamagedCheckpointsAreErrorsNamingTheFile) {
  save_step4("run");
  const std::string d = step_dir("run", 4), index = d + "/index.json",
                    file = d + "/rank-00000.safetensors";
  const std::string good_index = read_text_file(index), good_file = read_text_file(file);
  auto restore = [&] {
    std::ofstream(index, std::ios::trunc | std::ios::binary) << good_index;
    std::ofstream(file, std::ios::trunc | std::ios::binary) << good_file;
  };
  JobConfig again = job("run");
  // Corrupted index: not JSON, a field missing, a slice outside its tensor.
  std::ofstream(index, std::ios::trunc) << good_index.substr(0, good_index.size() / 2);
  EXPECT_CONTAINS(load_error(again), index + " is corrupted: not valid JSON");
  nlohmann::json j = nlohmann::json::parse(good_index);
  j["state"].erase("lr_step");
  write_json(index, j);
  EXPECT_CONTAINS(load_error(again), index + " is corrupted: state: missing \"lr_step\"");
  j = nlohmann::json::parse(good_index);
  j["tensors"][1]["slices"][0]["offsets"][0] = 7;
  write_json(index, j);
  EXPECT_CONTAINS(load_error(again), "lies outside the tensor's shape");
  // Missing and extra tensors.
  j = nlohmann::json::parse(good_index);
  const std::string first = j["tensors"][0]["name"];
  j["tensors"].erase(0);
  write_json(index, j);
  EXPECT_CONTAINS(load_error(again), "lacks tensor " + first + ", which this model has");
  j = nlohmann::json::parse(good_index);
  j["tensors"].push_back({{"name", "extra.weight"},
                          {"dtype", "F32"},
                          {"shape", {0}},
                          {"slices", nlohmann::json::array()}});
  write_json(index, j);
  EXPECT_CONTAINS(load_error(again), "holds tensor extra.weight, which this model does not have");
  // A dtype it cannot convert.
  j = nlohmann::json::parse(good_index);
  j["tensors"][0]["dtype"] = "I32";
  write_json(index, j);
  EXPECT_CONTAINS(load_error(again), "tensor " + first +
                                         " is stored as I32, which cannot be converted to this "
                                         "run's float32");
  restore();
  // A truncated file, then one byte changed: named by the size check and the checksum.
  std::ofstream(file, std::ios::trunc | std::ios::binary)
      << good_file.substr(0, good_file.size() - 10);
  EXPECT_CONTAINS(load_error(again), file + " has " + std::to_string(good_file.size() - 10) +
                                         " bytes, the checkpoint index says " +
                                         std::to_string(good_file.size()));
  std::string flipped = good_file;
  flipped[flipped.size() - 3] ^= 0x5a;
  std::ofstream(file, std::ios::trunc | std::ios::binary) << flipped;
  EXPECT_CONTAINS(load_error(again), "checksum mismatch in " + file);
  restore();
  Trainer t(again, test_runtime());  // intact again: loads
  EXPECT_EQ(t.resumed().step, 4);
}

TEST_F(CheckpointTest, BadPathsAndKeys) {
  EXPECT_CONTAINS(load_error(job("x", {"--checkpoint.initial_load_path", "/nonexistent/step-3"})),
                  "[checkpoint] initial_load_path /nonexistent/step-3 does not exist");
  // A folder that cannot be made (root writes anywhere, so: a path through a regular file).
  testing::TempDirTest::write("x/a_file", "x");
  EXPECT_CONTAINS(load_error(job("x", {"--checkpoint.folder", "a_file/checkpoint"})),
                  "cannot create checkpoint folder " +
                      (dir_ / "x" / "a_file" / "checkpoint").string() + ": Not a directory");
  auto cfg_error = [](std::vector<std::string> o) {
    return error_message<ConfigError>([&] { testing::tiny_job(o); });
  };
  EXPECT_CONTAINS(cfg_error({"--checkpoint.keep_latest_k", "1"}),
                  "keep_latest_k must be 0 (keep all) or at least 2");
  EXPECT_CONTAINS(cfg_error({"--checkpoint.exclude_from_loading", "optimizer,model"}),
                  "optimizer, lr_scheduler, dataloader, train_state");
  EXPECT_CONTAINS(cfg_error({"--checkpoint.last_save_in_hf", "true",
                             "--checkpoint.last_save_model_only", "false"}),
                  "last_save_in_hf = true needs last_save_model_only = true");
  EXPECT_CONTAINS(load_error(job("x", {"--checkpoint.initial_load_path", dir_.string(),
                                       "--checkpoint.initial_load_in_hf", "true"})),
                  "HF folder '" + dir_.string() + "' has no config.json");
  EXPECT_CONTAINS(load_error(job("x", {"--checkpoint.initial_load_path", dir_.string(),
                                       "--checkpoint.initial_load_model_only", "false"})),
                  "is not a complete checkpoint: it has no index.json");
}

TEST(CheckpointConfig, TorchtitanKeysAndListSyntax) {
  auto parse = [](const std::string& toml) {
    return job_config_from_values(load_config_string(job_config_schema(), toml, "t.toml", {}));
  };
  const JobConfig c = parse(
      "[checkpoint]\nenable_checkpoint = true\nexclude_from_loading = [\"dataloader\", "
      "\"lr_scheduler\"]\nasync_mode = \"async_with_pinned_mem\"\n");
  EXPECT_TRUE(c.checkpoint.enable);  // the older torchtitan name is an alias
  EXPECT_EQ(c.checkpoint.excluded(), (std::vector<std::string>{"dataloader", "lr_scheduler"}));
  EXPECT_EQ(c.checkpoint.async_mode, CheckpointAsync::kAsyncWithPinnedMem);
  const JobConfig d = JobConfig{};
  EXPECT_FALSE(d.checkpoint.enable);
  EXPECT_EQ(d.checkpoint.folder, "checkpoint");
  EXPECT_EQ(d.checkpoint.interval, 500);
  EXPECT_EQ(d.checkpoint.keep_latest_k, 10);
  EXPECT_EQ(d.checkpoint.load_step, -1);
  EXPECT_TRUE(d.checkpoint.initial_load_model_only);
  EXPECT_TRUE(d.checkpoint.last_save_model_only);
  EXPECT_EQ(d.checkpoint.export_dtype, FileDType::kF32);
  EXPECT_EQ(d.checkpoint.async_mode, CheckpointAsync::kDisabled);
  EXPECT_CONTAINS(
      error_message<ConfigError>([&] { parse("[checkpoint]\nexclude_from_loading = [1, 2]\n"); }),
      "[checkpoint] exclude_from_loading expects a comma-separated string or an array "
      "of strings");
}

TEST_F(CheckpointTest, DiskFullMidSaveKeepsThePreviousCheckpoint) {
  save_step4("run");
  const std::string tmp = (dir_ / "run" / "checkpoint" / ".step-8.tmp").string();
  {
    Trainer t(job("run"), test_runtime());
    ASSERT_EQ(t.resumed().step, 4);
    // The fault hook counts from here: the length field and header are writes 1 and 2.
    set_write_fault(parse_write_fault("enospc@3"), 0);
    for (int i = 0; i < 3; ++i) t.step();
    std::string m = error_message<IoError>([&] { t.step(); });
    set_write_fault({}, 0);
    EXPECT_CONTAINS(m, "cannot write " + tmp + "/rank-00000.safetensors: No space left on device");
  }
  EXPECT_FALSE(fs::exists(step_dir("run", 8)));
  Trainer t(job("run"), test_runtime());  // resumes from the intact step 4
  EXPECT_EQ(t.resumed().step, 4);
  EXPECT_FALSE(fs::exists(tmp));
}

}  // namespace
}  // namespace meshtrain
