// TensorBoard events: the writer's records read back (protobuf + both CRC-32C checks), a corrupted
// or truncated record is caught, an unwritable folder is a clear error, and a training run with
// validation writes every series (loss, grad_norm, lr, throughput, memory, validation loss,
// per-layer expert load) with the values the trainer logged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/train/tensorboard.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {
namespace fs = std::filesystem;

class TensorBoardTest : public testing::TempDirTest {
 protected:
  std::string bytes_of(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void overwrite(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  }
};

TEST_F(TensorBoardTest, MaskedCrcIsTfRecords) {
  // CRC-32C("123456789") = 0xE3069283 (the standard check value); TFRecord stores it masked.
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(masked_crc32c("123456780", 9), masked_crc32c("123456789", 9));
}

TEST_F(TensorBoardTest, WriterRecordsReadBack) {
  std::string path;
  {
    TensorBoardWriter w((dir_ / "tb/run").string());
    w.add_scalars(1, {{"loss", 2.5}, {"grad_norm", 0.125}});
    // A 0.0 must be on the wire (TensorBoard drops a value whose simple_value is absent).
    w.add_scalars(7, {{"loss", -1.0 / 3.0}, {"moe/layers.4/load_min", 0.0}});
    path = w.path();
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::vector<TensorBoardEvent> ev = read_tensorboard_events(path);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_TRUE(ev[0].scalars.empty());
  EXPECT_EQ(ev[1].step, 1);
  EXPECT_EQ(ev[1].scalars, (std::map<std::string, float>{{"grad_norm", 0.125f}, {"loss", 2.5f}}));
  EXPECT_EQ(ev[2].step, 7);
  EXPECT_EQ(ev[2].scalars.at("loss"), float(-1.0 / 3.0));
  ASSERT_EQ(ev[2].scalars.count("moe/layers.4/load_min"), 1u) << "a zero value was not written";
  EXPECT_EQ(ev[2].scalars.at("moe/layers.4/load_min"), 0.0f);
  EXPECT_GT(ev[2].wall_time, 1.6e9);  // seconds since the epoch
}

TEST_F(TensorBoardTest, CorruptedAndTruncatedRecordsAreDetected) {
  std::string path;
  {
    TensorBoardWriter w(dir_.string());
    w.add_scalars(1, {{"loss", 2.5}});
    path = w.path();
  }
  const std::string good = bytes_of(path);
  const size_t first = 12 + size_t(uint8_t(good[0])) + 4;  // the second record starts here
  std::string bad = good;
  bad[first + 14] ^= 0x01;  // a data byte of the second record
  overwrite(path, bad);
  EXPECT_EQ(testing::error_message<DataError>([&] { read_tensorboard_events(path); }),
            fmt::format("TensorBoard file '{}': record at byte {}: data checksum does not match",
                        path, first));
  bad = good;
  bad[first] ^= 0x40;  // its length
  overwrite(path, bad);
  EXPECT_CONTAINS(testing::error_message<DataError>([&] { read_tensorboard_events(path); }),
                  fmt::format("record at byte {}: length checksum does not match", first));
  overwrite(path, good.substr(0, good.size() - 3));
  EXPECT_CONTAINS(testing::error_message<DataError>([&] { read_tensorboard_events(path); }),
                  fmt::format("record at byte {} is truncated", first));
  overwrite(path, good);
  EXPECT_EQ(read_tensorboard_events(path).size(), 2u);
}

TEST_F(TensorBoardTest, UnwritableFolderIsAClearError) {
  const std::string file = write("occupied", "a file, not a folder");
  EXPECT_EQ(testing::error_message<IoError>([&] { TensorBoardWriter w(file + "/tb"); }),
            fmt::format("[metrics] save_tb_folder: cannot create the TensorBoard folder '{}/tb': "
                        "Not a directory",
                        file));
}

TEST_F(TensorBoardTest, FolderLayoutFollowsTorchtitan) {
  EXPECT_EQ(tensorboard_folder("out", "tb", "20260101-1200", 3, false), "out/tb/20260101-1200");
  EXPECT_EQ(tensorboard_folder("out", "tb", "20260101-1200", 3, true),
            "out/tb/20260101-1200/rank_3");
}

// A short MoE run with validation: every series is there, once per logged step, with the values
// the trainer logged.
TEST_F(TensorBoardTest, TrainingRunWritesEverySeries) {
  const std::string held_out = write("held_out.txt", [] {
    std::string t;
    for (int i = 0; i < 40; ++i)
      t += fmt::format("Held-out document {} about nothing much.\n\n", i);
    return t;
  }());
  JobConfig cfg = testing::tiny_job({"--model.name",
                                     "deepseek_v3",
                                     "--model.flavor",
                                     "debugmodel",
                                     "--model.n_layers",
                                     "2",
                                     "--training.seq_len",
                                     "16",
                                     "--training.steps",
                                     "3",
                                     "--job.dump_folder",
                                     dir_.string(),
                                     "--metrics.enable_tensorboard",
                                     "--metrics.save_tb_folder",
                                     "board",
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
    Trainer t(cfg, testing::test_runtime().world("mpi"), testing::test_runtime().launch());
    logged = t.train();
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "board"))
    if (e.is_regular_file()) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::vector<TensorBoardEvent> ev = read_tensorboard_events(files[0].string());
  std::map<std::string, std::vector<std::pair<int64_t, float>>> series;
  for (const TensorBoardEvent& e : ev)
    for (const auto& [tag, v] : e.scalars) series[tag].emplace_back(e.step, v);
  for (const char* tag :
       {"loss_metrics/global_avg_loss", "grad_norm", "lr", "throughput(tps)", "tflops",
        "memory/max_active(GiB)", "memory/max_active(%)", "time_metrics/end_to_end(s)",
        "moe/layers.1/load_max", "moe/layers.1/load_mean", "moe/layers.1/load_min",
        "moe/layers.1/imbalance", "moe/imbalance_avg", "moe/imbalance_max"}) {
    SCOPED_TRACE(tag);
    ASSERT_EQ(series[tag].size(), 3u);  // steps 1, 2, 3
    for (int i = 0; i < 3; ++i) EXPECT_EQ(series[tag][size_t(i)].first, i + 1);
  }
  EXPECT_EQ(series.count("mfu(%)"), 0u);  // the cpu backend has no known peak: no series
  ASSERT_EQ(logged.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(series["loss_metrics/global_avg_loss"][size_t(i)].second, float(logged[i].loss));
    EXPECT_EQ(series["grad_norm"][size_t(i)].second, float(logged[i].grad_norm));
    EXPECT_EQ(series["lr"][size_t(i)].second, float(logged[i].lr));
  }
  // Validation after step 1 and step 2 (freq 2): a finite loss near the training loss.
  const auto& val = series["validation_metrics/loss"];
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(val[0].first, 1);
  EXPECT_EQ(val[1].first, 2);
  for (const auto& [step, v] : val) EXPECT_TRUE(v > 1.0f && v < 10.0f) << v;
  EXPECT_EQ(series["validation_metrics/throughput(tps)"].size(), 2u);
}

}  // namespace
}  // namespace meshtrain
