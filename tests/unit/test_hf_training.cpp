// HF weights through the trainer: last_save_in_hf writes the final weights in HF layout and
// initial_load_in_hf starts a run from them bitwise; the [debug] dump_step files (weights the step
// started from, its global gradients under HF names, expert loads, the windows it read) hold what
// the PyTorch cross-check (tests/reference) replays.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/train/convert.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::test_runtime;

class HfTraining : public testing::TempDirTest {};

TEST_F(HfTraining, LastSaveInHfThenInitialLoadInHfStartsFromTheFinalWeights) {
  for (const char* model : {"llama3", "deepseek_v3"}) {
    std::vector<std::string> m = {"--model.name", model};
    if (std::string(model) == "deepseek_v3")
      m = {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel", "--model.n_layers", "2"};
    const fs::path run = dir_ / model;
    std::vector<std::string> a = m;
    for (const std::string& s : std::vector<std::string>{
             "--job.dump_folder", run.string(), "--training.steps", "3", "--checkpoint.enable",
             "true", "--checkpoint.last_save_in_hf", "true", "--checkpoint.interval", "100"})
      a.push_back(s);
    std::vector<std::vector<float>> final_weights;
    std::vector<std::string> names;
    {
      Trainer t(testing::tiny_job(a), test_runtime());
      for (int i = 0; i < 3; ++i) t.step();
      t.wait_for_checkpoint();
      for (const ParamInfo& p : t.plan().params()) {
        if (p.name.find("tokens_per_expert") != std::string::npos) continue;
        names.push_back(p.name);
        final_weights.push_back(t.params().master_to_host(p.name).to_vector<float>());
      }
    }
    const fs::path hf = run / "checkpoint" / "step-3";
    ASSERT_TRUE(fs::exists(hf / "config.json")) << hf;
    ASSERT_TRUE(fs::exists(hf / "model.safetensors.index.json"));
    std::vector<std::string> b = m;
    for (const std::string& s :
         std::vector<std::string>{"--job.dump_folder", (dir_ / "b").string(), "--checkpoint.enable",
                                  "true", "--checkpoint.initial_load_path", hf.string(),
                                  "--checkpoint.initial_load_in_hf", "true"})
      b.push_back(s);
    Trainer t(testing::tiny_job(b), test_runtime());
    EXPECT_EQ(t.resumed().step, 0);
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_EQ(t.params().master_to_host(names[i]).to_vector<float>(), final_weights[i])
          << model << " " << names[i];
    fs::remove_all(dir_ / "b");
  }
}

TEST_F(HfTraining, ConvertCheckpointToHfAndBackKeepsEveryWeightBitwise) {
  const std::vector<std::string> ds = {"--model.name", "deepseek_v3",      "--model.flavor",
                                       "debugmodel",   "--model.n_layers", "2"};
  std::vector<std::string> a = ds;
  for (const std::string& s :
       std::vector<std::string>{"--job.dump_folder", (dir_ / "run").string(), "--training.steps",
                                "2", "--checkpoint.enable", "true", "--checkpoint.interval", "100",
                                "--checkpoint.last_save_model_only", "false"})
    a.push_back(s);
  std::map<std::string, std::vector<float>> want;
  {
    Trainer t(testing::tiny_job(a), test_runtime());
    t.step(), t.step();
    t.wait_for_checkpoint();
    for (const ParamInfo& p : t.plan().params())
      if (p.name.find("tokens_per_expert") == std::string::npos)
        want[p.name] = t.params().master_to_host(p.name).to_vector<float>();
  }
  const std::string ckpt = (dir_ / "run" / "checkpoint" / "step-2").string();
  const std::string hf = (dir_ / "hf").string(), back = (dir_ / "back").string();
  run_convert({.input = ckpt, .output = hf, .max_shard_bytes = 8 << 20});
  int shards = 0;
  for (const auto& e : fs::directory_iterator(hf)) shards += e.path().extension() == ".safetensors";
  EXPECT_GE(shards, 3) << "8 MB shards";
  run_convert({.input = hf, .output = back});
  // The HF folder as initial weights, and the converted-back checkpoint: the same weights.
  for (const auto& [path, in_hf] : {std::pair{hf, "true"}, std::pair{back, "false"}}) {
    std::vector<std::string> b = ds;
    for (const std::string& s : std::vector<std::string>{
             "--job.dump_folder", (dir_ / "b").string(), "--checkpoint.enable", "true",
             "--checkpoint.initial_load_path", path, "--checkpoint.initial_load_in_hf", in_hf})
      b.push_back(s);
    Trainer t(testing::tiny_job(b), test_runtime());
    for (const auto& [name, v] : want)
      EXPECT_EQ(t.params().master_to_host(name).to_vector<float>(), v) << path << " " << name;
    fs::remove_all(dir_ / "b");
  }
  EXPECT_CONTAINS(
      testing::error_message<IoError>([&] { run_convert({.input = hf, .output = back}); }),
      "already exists (nothing is replaced)");
  EXPECT_CONTAINS(testing::error_message<ConfigError>([&] {
                    run_convert({.input = dir_.string(), .output = (dir_ / "x").string()});
                  }),
                  "is neither a meshtrain checkpoint (no index.json) nor a Hugging Face folder");
}

TEST_F(HfTraining, DebugDumpHoldsTheStepsWeightsGradientsLoadsAndWindows) {
  const std::string tokens = (dir_ / "tokens.bin").string();
  std::vector<int32_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % 300);
  write_token_file(tokens, ids);
  JobConfig cfg = testing::tiny_job(
      {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel", "--model.n_layers", "2",
       "--training.dataset", "tokens", "--training.dataset_path", tokens, "--debug.dump_step", "2",
       "--job.dump_folder", (dir_ / "run").string(), "--training.steps", "2"});
  Trainer t(cfg, test_runtime());
  std::vector<std::vector<float>> before;
  t.step();
  for (const ParamInfo& p : t.plan().params())
    before.push_back(t.params().master_to_host(p.name).to_vector<float>());
  StepRecord r = t.step();
  const fs::path d = dir_ / "run" / "debug" / "step-2";
  // model/: the weights step 2 started from.
  HfFolder hf((d / "model").string());
  HfLayout layout(*create_model(ModelOptions{.name = "deepseek_v3",
                                             .flavor = "debugmodel",
                                             .tokenizer_vocab = 300,
                                             .n_layers_override = 2}),
                  t.plan().params());
  hf.check(layout, DType::kF32);
  const auto& ps = t.plan().params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!layout.covers(ps[i].name)) continue;
    Tensor host = Tensor::empty(ps[i].local_shape, ps[i].dtype);
    read_hf_piece(hf, layout, ps[i], host);
    EXPECT_EQ(host.to_vector<float>(), before[i]) << ps[i].name;
  }
  // gradients.safetensors: the global gradient of step 2 (one micro-batch: the store still holds
  // it), under HF names; its norm is the logged one.
  SafetensorsReader g((d / "gradients.safetensors").string());
  double sq = 0;
  for (const SafetensorsEntry& e : g.entries()) {
    std::vector<float> v(size_t(e.numel()));
    g.read(e, v.data(), v.size() * 4);
    for (float x : v) sq += double(x) * double(x);
  }
  EXPECT_NEAR(std::sqrt(sq) / r.grad_norm, 1.0, 1e-6);
  const SafetensorsEntry& q = g.at("model.layers.1.mlp.experts.5.up_proj.weight");
  std::vector<float> qv(size_t(q.numel()));
  g.read(q, qv.data(), qv.size() * 4);
  const std::vector<float> w3 = t.params().grad("layers.1.moe.experts.w3").to_vector<float>();
  EXPECT_TRUE(std::equal(qv.begin(), qv.end(), w3.begin() + 5 * int64_t(qv.size())));
  // moe_load.json: top_k tokens per token of the step; dump.json: the windows it read.
  nlohmann::json loads = nlohmann::json::parse(read_text_file((d / "moe_load.json").string()));
  double routed = 0;
  for (double c : loads["layers.1.moe"]) routed += c;
  EXPECT_EQ(routed, double(t.tokens_per_step() * 3));
  nlohmann::json info = nlohmann::json::parse(read_text_file((d / "dump.json").string()));
  EXPECT_EQ(info["rows_per_step"], 2);
  EXPECT_EQ(info["window_begin"], 2);
  EXPECT_EQ(info["windows_per_epoch"], 3000 / 33);
  EXPECT_EQ(info["loss"].get<double>(), r.loss);
  EXPECT_FALSE(fs::exists(dir_ / "run" / "debug" / "step-1"));
}

}  // namespace
}  // namespace meshtrain
