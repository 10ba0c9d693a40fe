// Whole models on the GPU against the CPU oracle, through the real trainer (data loader, step
// graph, optimizer graph, load balancing):
//   - the llama3 and DeepSeek-V3 debug models in float32 on CUDA give the CPU run's losses and
//     gradient norms within 1e-4 relative for 5 steps (the bar; the kernels compute in
//     fp32 with different summation orders, so bitwise equality is not expected);
//   - the bfloat16 run (bf16 weights and activations, fp32 master weights and moments) tracks the
//     float32 CUDA run for 50 steps: every step's loss and the mean relative difference over the
//     50 steps within the model's TrackingBar, and both runs' losses fall;
//   - a DeepSeek-V3 checkpoint saved asynchronously on the GPU resumes there and loads on the CPU;
//   - bf16 compute copies (written by the optimizer) are bitwise the cast path ([training]
//     compute_weight_copies = false): losses, norms and masters over 6 steps, a resume from a
//     cast-path checkpoint and a start from its HF weights;
//   - the update overlapped with the next step ([optimizer] overlap_next_step) is bitwise the
//     update in line, over 8 steps of train().
// The corpus is the repository's own documentation (the `text` dataset), so the test needs no
// package that a GPU machine may lack: $MESHTRAIN_SOURCE_DIR (set by ctest), else the working
// directory, must hold ARCHITECTURE.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

// bf16 vs fp32 over 50 steps: the per-step bound and the bound on the mean relative difference.
// bf16 rounds every stored activation and gathered weight (2^-9 relative), and the two runs drift
// apart as they train. Measured on an H200 (2026-12-02): llama3 mean 2.0e-4, worst 7.9e-4 at lr
// 8e-4; DeepSeek-V3 mean 4.1e-4, worst 1.2e-3 at lr 3e-4. DeepSeek runs at the lower rate with a
// longer warm-up because routing is discontinuous (a token whose best experts swap changes its
// layer output outright): at lr 8e-4 its early loss spikes landed on different steps in the two
// runs (one bf16 spike 39% above fp32). The bounds leave about eight times the measured values.
struct TrackingBar {
  std::vector<std::string> lr;
  double step_tol, mean_tol;
};
const TrackingBar kLlamaBar{{}, 1e-2, 2e-3};
const TrackingBar kDeepSeekBar{
    {"--optimizer.lr", "3e-4", "--lr_scheduler.warmup_steps", "10"}, 1e-2, 3e-3};
constexpr double kFp32Tol = 1e-4;

Runtime& runtime() {
  static int argc = 1;
  static char name[] = "meshtrain_cuda_tests";
  static char* argv_storage[] = {name, nullptr};
  static char** argv = argv_storage;
  static std::unique_ptr<Runtime> rt = std::make_unique<Runtime>(&argc, &argv);
  return *rt;
}

std::string corpus_path() {
  const char* env = std::getenv("MESHTRAIN_SOURCE_DIR");
  std::filesystem::path dir =
      env && *env ? std::filesystem::path(env) : std::filesystem::current_path();
  std::filesystem::path p = dir / "ARCHITECTURE.md";
  if (!std::filesystem::exists(p))
    ADD_FAILURE() << "no corpus: " << p << " does not exist (set MESHTRAIN_SOURCE_DIR to the "
                  << "repository root)";
  return p.string();
}

// The debug flavor of `model` on `device`, small batch, fixed seed, no files written.
JobConfig debug_job(const std::string& model, const std::string& device, int steps,
                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"--model.name",
                                model,
                                "--model.flavor",
                                "debugmodel",
                                "--job.device",
                                device,
                                "--training.dataset",
                                "text",
                                "--training.dataset_path",
                                corpus_path(),
                                "--training.seq_len",
                                "128",
                                "--training.local_batch_size",
                                "2",
                                "--training.steps",
                                std::to_string(steps),
                                "--training.seed",
                                "11",
                                "--optimizer.lr",
                                "8e-4",
                                "--lr_scheduler.warmup_steps",
                                "5",
                                "--metrics.log_freq",
                                "1000",
                                "--metrics.enable_jsonl",
                                "false",
                                "--job.dump_folder",
                                "/tmp/meshtrain_cuda_test_outputs"};
  o.insert(o.end(), extra.begin(), extra.end());
  return parse_job_config("", o);
}

std::vector<StepRecord> run(const JobConfig& cfg) {
  Trainer t(cfg, runtime());
  std::vector<StepRecord> out;
  for (int i = 0; i < cfg.training.steps; ++i) out.push_back(t.step());
  return out;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

const std::vector<std::string> kFp32 = {"--training.mixed_precision_param", "float32"};
const std::vector<std::string> kBf16 = {"--training.mixed_precision_param", "bfloat16"};

void expect_fp32_cuda_matches_cpu(const std::string& model) {
  std::vector<StepRecord> cpu = run(debug_job(model, "cpu", 5, kFp32));
  std::vector<StepRecord> gpu = run(debug_job(model, "cuda", 5, kFp32));
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LE(rel(gpu[i].loss, cpu[i].loss), kFp32Tol)
        << model << " step " << i + 1 << ": cuda loss " << gpu[i].loss << ", cpu " << cpu[i].loss;
    EXPECT_LE(rel(gpu[i].grad_norm, cpu[i].grad_norm), kFp32Tol)
        << model << " step " << i + 1 << ": cuda grad_norm " << gpu[i].grad_norm << ", cpu "
        << cpu[i].grad_norm;
  }
}

void expect_bf16_tracks_fp32(const std::string& model, const TrackingBar& bar) {
  const int steps = 50;
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), bar.lr.begin(), bar.lr.end());
    return o;
  };
  std::vector<StepRecord> f32 = run(debug_job(model, "cuda", steps, with(kFp32)));
  std::vector<StepRecord> b16 = run(debug_job(model, "cuda", steps, with(kBf16)));
  ASSERT_EQ(f32.size(), b16.size());
  double sum = 0, worst = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    ASSERT_TRUE(std::isfinite(b16[i].loss)) << model << " bf16 step " << i + 1;
    double r = rel(b16[i].loss, f32[i].loss);
    sum += r;
    worst = std::max(worst, r);
    EXPECT_LE(r, bar.step_tol) << model << " step " << i + 1 << ": bf16 loss " << b16[i].loss
                               << ", fp32 " << f32[i].loss;
  }
  double mean = sum / double(f32.size());
  EXPECT_LE(mean, bar.mean_tol) << model << ": mean relative loss difference";
  EXPECT_LT(f32.back().loss, 0.8 * f32.front().loss) << model << " fp32 must learn";
  EXPECT_LT(b16.back().loss, 0.8 * b16.front().loss) << model << " bf16 must learn";
  std::fflush(stdout);
  std::printf(
      "[ bf16 vs fp32 ] %s: %d steps, mean rel diff %.2e, worst %.2e, loss %.4f -> %.4f "
      "(fp32 %.4f -> %.4f)\n",
      model.c_str(), steps, mean, worst, b16.front().loss, b16.back().loss, f32.front().loss,
      f32.back().loss);
}

TEST(CudaTraining, Llama3DebugFp32MatchesCpuFor5Steps) { expect_fp32_cuda_matches_cpu("llama3"); }

TEST(CudaTraining, DeepSeekV3DebugFp32MatchesCpuFor5Steps) {
  expect_fp32_cuda_matches_cpu("deepseek_v3");
}

TEST(CudaTraining, Llama3DebugBf16TracksFp32For50Steps) {
  expect_bf16_tracks_fp32("llama3", kLlamaBar);
}

TEST(CudaTraining, DeepSeekV3DebugBf16TracksFp32For50Steps) {
  expect_bf16_tracks_fp32("deepseek_v3", kDeepSeekBar);
}

std::vector<std::vector<float>> masters_of(const Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const ParamInfo& p : t.plan().params())
    out.push_back(t.params().master_to_host(p.name).to_vector<float>());
  return out;
}

// Checkpoints on the GPU: an async save (pinned snapshot, background writer) restores exactly the
// state it saved, on the GPU (the resumed steps repeat the uninterrupted run's, which is bitwise
// repeatable by design) and on the CPU (the masters of a CUDA checkpoint load bitwise).
TEST(CudaTraining, DeepSeekV3CheckpointResumesOnGpuAndLoadsOnCpu) {
  const std::string root = "/tmp/meshtrain_cuda_checkpoint";
  std::filesystem::remove_all(root);
  const std::vector<std::string> save = {"--checkpoint.enable",
                                         "true",
                                         "--checkpoint.interval",
                                         "4",
                                         "--checkpoint.async_mode",
                                         "async",
                                         "--checkpoint.last_save_model_only",
                                         "false"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<StepRecord> whole;
  std::vector<std::vector<float>> at4;
  {
    Trainer t(debug_job("deepseek_v3", "cuda", 8,
                        with(with(kBf16, save), {"--job.dump_folder", root + "/a"})),
              runtime());
    for (int i = 0; i < 8; ++i) {
      whole.push_back(t.step());
      if (i == 3) at4 = masters_of(t);
    }
    t.wait_for_checkpoint();
  }
  const std::string step4 = root + "/a/checkpoint/step-4";
  Trainer gpu(debug_job("deepseek_v3", "cuda", 8,
                        with(with(kBf16, save),
                             {"--job.dump_folder", root + "/b", "--checkpoint.initial_load_path",
                              step4, "--checkpoint.initial_load_model_only", "false"})),
              runtime());
  ASSERT_EQ(gpu.resumed().step, 4);
  EXPECT_TRUE(masters_of(gpu) == at4) << "the masters loaded on the GPU differ from those saved";
  for (int i = 4; i < 8; ++i) {
    StepRecord r = gpu.step();
    EXPECT_EQ(r.loss, whole[size_t(i)].loss) << "step " << i + 1;
    EXPECT_EQ(r.grad_norm, whole[size_t(i)].grad_norm) << "step " << i + 1;
  }
  Trainer cpu(debug_job("deepseek_v3", "cpu", 8,
                        with(kFp32, {"--checkpoint.enable", "true", "--job.dump_folder",
                                     root + "/c", "--checkpoint.initial_load_path", step4})),
              runtime());
  EXPECT_TRUE(masters_of(cpu) == at4) << "the masters loaded on the CPU differ from those saved";
}

const std::vector<std::string> kCastPath = {"--training.compute_weight_copies", "false"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every bf16 compute copy equals the cast of its float32 master (round to nearest even), bit for
// bit.
void expect_copies_follow_masters(const Trainer& t, const std::string& when) {
  Backend& be = cudatest::cuda_backend();
  int copies = 0;
  for (const ParamInfo& p : t.plan().params()) {
    if (p.compute == kNoValue) continue;
    ++copies;
    const Tensor m = t.params().master_to_host(p.name);
    const Tensor c = cudatest::to_host(be, t.params().compute_copy(p.name));
    ASSERT_EQ(c.dtype(), DType::kBF16) << p.name;
    for (int64_t i = 0; i < m.numel(); ++i)
      if (c.data<BFloat16>()[i].bits != BFloat16(m.data<float>()[i]).bits) {
        ADD_FAILURE() << when << ": " << p.name << "[" << i << "] copy "
                      << float(c.data<BFloat16>()[i]) << ", master " << m.data<float>()[i];
        return;
      }
  }
  EXPECT_GT(copies, 0) << when;
}

void expect_same_steps(const std::vector<StepRecord>& a, const std::vector<StepRecord>& b,
                       size_t b_from, const std::string& what) {
  ASSERT_LE(a.size() + b_from, b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i + b_from].loss) << what << " step " << i + b_from + 1;
    EXPECT_EQ(a[i].grad_norm, b[i + b_from].grad_norm) << what << " step " << i + b_from + 1;
  }
}

void expect_copies_are_the_cast_path(const std::string& model) {
  const int steps = 6;
  std::vector<StepRecord> copies, cast;
  std::vector<std::vector<float>> with_copies, with_casts;
  {
    Trainer t(debug_job(model, "cuda", steps, kBf16), runtime());
    EXPECT_TRUE(t.params().has_compute_copies());
    expect_copies_follow_masters(t, model + " at start-up");
    for (int i = 0; i < steps; ++i) {
      copies.push_back(t.step());
      expect_copies_follow_masters(t, fmt::format("{} after step {}", model, i + 1));
    }
    with_copies = masters_of(t);
  }
  {
    Trainer t(debug_job(model, "cuda", steps, cat(kBf16, kCastPath)), runtime());
    EXPECT_FALSE(t.params().has_compute_copies());
    for (int i = 0; i < steps; ++i) cast.push_back(t.step());
    with_casts = masters_of(t);
  }
  expect_same_steps(copies, cast, 0, model + " copies vs casts");
  EXPECT_TRUE(with_copies == with_casts)
      << model << ": the masters differ after " << steps << " steps";
}

TEST(CudaTraining, Llama3DebugBf16ComputeCopiesAreBitwiseTheCastPath) {
  expect_copies_are_the_cast_path("llama3");
}

TEST(CudaTraining, DeepSeekV3DebugBf16ComputeCopiesAreBitwiseTheCastPath) {
  expect_copies_are_the_cast_path("deepseek_v3");
}

// [optimizer] overlap_next_step: the update on its own stream, the next step starting on the
// weights already updated while the rest are, gives bitwise the run of the update in line (the
// logged losses and norms, every master, every bf16 compute copy), through train(), whose loop is
// where the update may still run when the next step starts.
TEST(CudaTraining, DeepSeekV3DebugBf16OverlappedUpdateIsBitwiseTheSame) {
  const int steps = 8;
  const std::vector<std::string> every_step = {"--metrics.log_freq", "1"};
  std::vector<StepRecord> inline_steps, overlapped_steps;
  std::vector<std::vector<float>> inline_masters, overlapped_masters;
  {
    Trainer t(debug_job("deepseek_v3", "cuda", steps, cat(kBf16, every_step)), runtime());
    inline_steps = t.train();
    inline_masters = masters_of(t);
  }
  {
    Trainer t(debug_job("deepseek_v3", "cuda", steps,
                        cat(cat(kBf16, every_step), {"--optimizer.overlap_next_step", "true"})),
              runtime());
    overlapped_steps = t.train();
    overlapped_masters = masters_of(t);
    expect_copies_follow_masters(t, "after the overlapped run");
  }
  ASSERT_EQ(inline_steps.size(), size_t(steps));
  expect_same_steps(inline_steps, overlapped_steps, 0, "inline vs overlapped update");
  EXPECT_TRUE(inline_masters == overlapped_masters)
      << "the masters differ after " << steps << " steps";
}

// The cast path saves step 4 (full) and its final weights in HF layout (step 6); with compute
// copies, a resume from step 4 repeats its steps 5 and 6, and a start from the HF weights repeats
// the cast path's start from them: the copies were cast from the loaded masters.
TEST(CudaTraining, DeepSeekV3Bf16CopiesResumeAndLoadHfAsTheCastPath) {
  const std::string root = "/tmp/meshtrain_cuda_copies";
  std::filesystem::remove_all(root);
  std::vector<StepRecord> whole;
  {
    Trainer t(
        debug_job("deepseek_v3", "cuda", 6,
                  cat(cat(kBf16, kCastPath),
                      {"--job.dump_folder", root + "/a", "--checkpoint.enable", "true",
                       "--checkpoint.interval", "4", "--checkpoint.last_save_in_hf", "true"})),
        runtime());
    for (int i = 0; i < 6; ++i) whole.push_back(t.step());
    t.wait_for_checkpoint();
  }
  {
    Trainer t(debug_job("deepseek_v3", "cuda", 6,
                        cat(kBf16, {"--job.dump_folder", root + "/b", "--checkpoint.enable", "true",
                                    "--checkpoint.initial_load_path", root + "/a/checkpoint/step-4",
                                    "--checkpoint.initial_load_model_only", "false"})),
              runtime());
    ASSERT_EQ(t.resumed().step, 4);
    expect_copies_follow_masters(t, "after the resume");
    std::vector<StepRecord> rest;
    for (int i = 4; i < 6; ++i) rest.push_back(t.step());
    expect_same_steps(rest, whole, 4, "resumed with copies");
  }
  std::vector<StepRecord> from_hf[2];
  for (int k = 0; k < 2; ++k) {
    Trainer t(
        debug_job("deepseek_v3", "cuda", 3,
                  cat(cat(kBf16, k ? kCastPath : std::vector<std::string>{}),
                      {"--job.dump_folder", root + (k ? "/d" : "/c"), "--checkpoint.enable", "true",
                       "--checkpoint.initial_load_path", root + "/a/checkpoint/step-6",
                       "--checkpoint.initial_load_in_hf", "true"})),
        runtime());
    if (k == 0) expect_copies_follow_masters(t, "after the HF load");
    for (int i = 0; i < 3; ++i) from_hf[k].push_back(t.step());
  }
  expect_same_steps(from_hf[0], from_hf[1], 0, "HF load, copies vs casts");
}

}  // namespace
}  // namespace meshtrain
