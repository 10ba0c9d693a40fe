// Multi-token prediction through the trainer (one rank): with mtp_loss_weight 0 the main model
// trains bit for bit as without MTP (issue 27 item 5), gradient accumulation gives each depth
// the loss of one big batch, the weight schedule, the step line / metrics.jsonl / TensorBoard /
// validation figures, and the configuration errors a user can hit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/block_name.h"
#include "meshtrain/train/tensorboard.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validator.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::test_runtime;

// The debug DeepSeek-V3 cut to 1 dense + 1 MoE layer, seq 16.
JobConfig ds_job(std::vector<std::string> extra) {
  std::vector<std::string> all = {
      "--model.name",       "deepseek_v3", "--model.flavor", "debugmodel", "--model.n_layers", "2",
      "--training.seq_len", "16",          "--optimizer.lr", "3e-4"};
  all.insert(all.end(), extra.begin(), extra.end());
  return testing::tiny_job(all);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(MtpTraining, WeightZeroTrainsTheMainModelBitwiseAsWithoutMtp) {
  for (const char* accum : {"2", "4"}) {  // one micro-batch a step, then two
    SCOPED_TRACE(fmt::format("global_batch_size {}", accum));
    Trainer plain(ds_job({"--training.global_batch_size", accum}), test_runtime());
    Trainer mtp(ds_job({"--training.global_batch_size", accum, "--model.mtp_layers", "2",
                        "--model.mtp_loss_weight", "0"}),
                test_runtime());
    for (int s = 1; s <= 3; ++s) {
      const StepRecord a = plain.step(true), b = mtp.step(true);
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(b.total_loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      ASSERT_EQ(b.mtp_losses.size(), 2u);
      EXPECT_TRUE(std::isfinite(b.mtp_losses[0]) && b.mtp_losses[0] > 1.0);
    }
    // Every main-model tensor (weights, expert bias, counters) and gradient, bit for bit; the MTP
    // modules got no gradient at all.
    int compared = 0;
    for (const ParamInfo& p : mtp.plan().params()) {
      const auto block = parse_block_name(p.name);
      if (block && block->index >= 2) {
        if (p.trainable)
          for (double g : mtp.params().grad(p.name).to_vector<float>()) ASSERT_EQ(g, 0.0) << p.name;
        continue;
      }
      EXPECT_TRUE(
          same_bits(plain.params().master_to_host(p.name), mtp.params().master_to_host(p.name)))
          << p.name;
      if (p.trainable)
        EXPECT_TRUE(same_bits(plain.params().grad(p.name), mtp.params().grad(p.name))) << p.name;
      ++compared;
    }
    EXPECT_EQ(compared, int(plain.plan().params().size()));
  }
}

TEST(MtpTraining, GradientAccumulationMatchesOneBigBatchForEveryDepthInFloat64) {
  const std::vector<std::string> f64 = {
      "--training.mixed_precision_param",  "float64", "--training.master_dtype", "float64",
      "--training.mixed_precision_reduce", "float64", "--model.mtp_layers",      "2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), f64.begin(), f64.end());
    return ds_job(extra);
  };
  Trainer big(with({"--training.local_batch_size", "4"}), test_runtime());
  Trainer accum(with({"--training.local_batch_size", "2", "--training.global_batch_size", "4"}),
                test_runtime());
  for (int s = 1; s <= 3; ++s) {
    const StepRecord a = big.step(true), b = accum.step(true);
    EXPECT_NEAR(a.loss, b.loss, 1e-10 * a.loss) << "step " << s;
    EXPECT_NEAR(a.total_loss, b.total_loss, 1e-10 * a.total_loss) << "step " << s;
    ASSERT_EQ(a.mtp_losses.size(), 2u);
    for (size_t k = 0; k < 2; ++k)
      EXPECT_NEAR(a.mtp_losses[k], b.mtp_losses[k], 1e-10 * a.mtp_losses[k]) << "depth " << k + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-10 * a.grad_norm) << "step " << s;
    // The objective is main + weight · mean over the depths.
    EXPECT_NEAR(a.total_loss, a.loss + 0.3 * (a.mtp_losses[0] + a.mtp_losses[1]) / 2,
                1e-12 * a.total_loss);
  }
}

TEST(MtpTraining, WeightScheduleChangesAfterItsStep) {
  ModelSection m;
  m.mtp_loss_weight = 0.3;
  EXPECT_EQ(m.mtp_loss_weight_at(1), 0.3);
  EXPECT_EQ(m.mtp_loss_weight_at(1000000), 0.3);  // after_step 0: one weight
  m.mtp_loss_weight_after_step = 2;
  m.mtp_loss_weight_after = 0.1;
  EXPECT_EQ(m.mtp_loss_weight_at(2), 0.3);
  EXPECT_EQ(m.mtp_loss_weight_at(3), 0.1);

  Trainer t(ds_job({"--model.mtp_layers", "1", "--model.mtp_loss_weight_after_step", "2",
                    "--model.mtp_loss_weight_after", "0.1"}),
            test_runtime());
  for (double want : {0.3, 0.3, 0.1, 0.1}) {
    const StepRecord r = t.step(true);
    EXPECT_EQ(r.mtp_loss_weight, want) << "step " << r.step;
    ASSERT_EQ(r.mtp_losses.size(), 1u);
    EXPECT_NEAR(r.total_loss, r.loss + want * r.mtp_losses[0], 1e-5 * r.total_loss)
        << "step " << r.step;
  }
}

TEST(MtpTraining, StepLineShowsEachDepthAfterTheLoss) {
  StepMetrics m;
  m.step = 7;
  m.loss = 4.5;
  m.grad_norm = 1.25;
  const std::string plain = MetricsLogger::format_line(m);
  EXPECT_CONTAINS(plain, "step:  7  loss:  4.5000  grad_norm:  1.2500");
  set_mtp_metrics({.total = 5.1, .main = 4.5, .mtp = {4.75, 5.25}}, 0.3, m);
  EXPECT_CONTAINS(MetricsLogger::format_line(m),
                  "step:  7  loss:  4.5000  mtp_loss_1:  4.7500  mtp_loss_2:  5.2500  grad_norm:");
  const auto tb = tensorboard_scalars(m);
  EXPECT_EQ(tb.at("loss_metrics/global_avg_loss"), 4.5);
  EXPECT_EQ(tb.at("loss_metrics/mtp_loss_2"), 5.25);
  EXPECT_EQ(tb.at("loss_metrics/total_loss"), 5.1);
  ValidationMetrics v{.step = 2, .loss = 4.0, .mtp_losses = {4.5}};
  EXPECT_CONTAINS(MetricsLogger::format_validation_line(v),
                  "validate step:  2  loss:  4.0000  mtp_loss_1:  4.5000  memory:");
}

class MtpRunFiles : public testing::TempDirTest {};

// A run's metrics.jsonl carries each depth, the total and the weight; its TensorBoard the same
// series; validation reports the main and the MTP losses apart.
TEST_F(MtpRunFiles, MetricsTensorBoardAndValidationReportEachDepth) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += fmt::format("Held-out document {} about little.\n\n", i);
  const std::string held_out = write("held_out.txt", text);
  JobConfig cfg = ds_job({"--model.mtp_layers",
                          "2",
                          "--training.steps",
                          "2",
                          "--job.dump_folder",
                          dir_.string(),
                          "--metrics.enable_jsonl",
                          "true",
                          "--metrics.enable_tensorboard",
                          "--validation.enable",
                          "--validation.dataset",
                          "text",
                          "--validation.dataset_path",
                          held_out,
                          "--validation.seq_len",
                          "16",
                          "--validation.local_batch_size",
                          "2",
                          "--validation.freq",
                          "2",
                          "--validation.steps",
                          "2"});
  std::vector<StepRecord> logged;
  {
    Trainer t(cfg, test_runtime().world("mpi"), test_runtime().launch());
    logged = t.train();
  }
  ASSERT_EQ(logged.size(), 2u);
  std::ifstream in(dir_ / "metrics.jsonl");
  std::string line;
  int steps = 0, validations = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("validation_loss")) {
      ++validations;
      EXPECT_TRUE(j.contains("validation_mtp_loss_1") && j.contains("validation_mtp_loss_2"));
      EXPECT_NE(j["validation_loss"].get<double>(), j["validation_mtp_loss_1"].get<double>());
      continue;
    }
    const StepRecord& r = logged[size_t(steps++)];
    EXPECT_EQ(j["loss"].get<double>(), r.loss);
    EXPECT_EQ(j["mtp_loss_1"].get<double>(), r.mtp_losses[0]);
    EXPECT_EQ(j["mtp_loss_2"].get<double>(), r.mtp_losses[1]);
    EXPECT_EQ(j["total_loss"].get<double>(), r.total_loss);
    EXPECT_EQ(j["mtp_loss_weight"].get<double>(), 0.3);
  }
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(validations, 2);  // after steps 1 and 2
  std::map<std::string, int> series;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_ / "tb"))
    if (e.is_regular_file())
      for (const TensorBoardEvent& ev : read_tensorboard_events(e.path().string()))
        for (const auto& [tag, v] : ev.scalars) ++series[tag];
  for (const char* tag :
       {"loss_metrics/global_avg_loss", "loss_metrics/mtp_loss_1", "loss_metrics/mtp_loss_2",
        "loss_metrics/total_loss", "validation_metrics/loss", "validation_metrics/mtp_loss_2"})
    EXPECT_EQ(series[tag], 2) << tag;
}

TEST(MtpTraining, ConfigurationErrorsSayWhatToChange) {
  using testing::expect_error;
  expect_error(
      ErrorKind::kConfig,
      [] {
        testing::tiny_job({"--model.mtp_layers", "1"});
      },
      "[model] mtp_layers = 1: multi-token prediction is a deepseek_v3 feature");
  expect_error(
      ErrorKind::kConfig,
      [] {
        ds_job({"--model.mtp_layers", "16"});
      },
      "[model] mtp_layers = 16 needs [training] seq_len > 16");
  expect_error(
      ErrorKind::kConfig,
      [] {
        ds_job({"--model.mtp_layers", "4", "--validation.enable", "--validation.seq_len", "4"});
      },
      "[model] mtp_layers = 4 needs [validation] seq_len > 4, found 4");
  expect_error(
      ErrorKind::kConfig,
      [] {
        ds_job({"--model.mtp_layers", "-1"});
      },
      "[model] mtp_layers must be >= 0");
  expect_error(
      ErrorKind::kConfig,
      [] {
        ds_job({"--model.mtp_loss_weight", "-0.5"});
      },
      "[model] mtp_loss_weight must be >= 0");
}

}  // namespace
}  // namespace meshtrain
