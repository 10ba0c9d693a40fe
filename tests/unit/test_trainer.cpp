// The spine end to end on one rank: a whole-model float64 gradient check, bitwise determinism,
// no allocations after the first step, and gradient accumulation equal to a bigger batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu_step.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::test_runtime;
using testing::tiny_job;

std::vector<double> losses_of(const JobConfig& cfg) {
  Trainer t(cfg, test_runtime());
  std::vector<double> out;
  for (int i = 0; i < cfg.training.steps; ++i) out.push_back(t.step().loss);
  return out;
}

TEST(Trainer, SameSeedGivesBitwiseIdenticalLosses) {
  JobConfig cfg = tiny_job();
  std::vector<double> a = losses_of(cfg), b = losses_of(cfg);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  JobConfig other = tiny_job({"--training.seed", "8"});
  EXPECT_NE(losses_of(other)[0], a[0]) << "a different seed must change the run";
}

TEST(Trainer, NoAllocatorCallsAfterTheFirstStep) {
  Trainer t(tiny_job({"--training.global_batch_size", "4"}), test_runtime());  // 2 micro-batches
  t.step();
  const int64_t after_first = allocation_count();
  for (int i = 0; i < 3; ++i) t.step();
  EXPECT_EQ(allocation_count(), after_first);
}

TEST(Trainer, LossFallsOnRealText) {
  JobConfig cfg = tiny_job({"--training.steps", "30", "--optimizer.lr", "1e-2"});
  std::vector<double> l = losses_of(cfg);
  EXPECT_LT(l.back(), 0.8 * l.front()) << "first " << l.front() << " last " << l.back();
}

TEST(Trainer, GradientAccumulationMatchesOneBigBatchInFloat64) {
  std::vector<std::string> f64 = {"--training.mixed_precision_param",  "float64",
                                  "--training.master_dtype",           "float64",
                                  "--training.mixed_precision_reduce", "float64"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), f64.begin(), f64.end());
    return tiny_job(extra);
  };
  Trainer big(with({"--training.local_batch_size", "4"}), test_runtime());
  Trainer accum(with({"--training.local_batch_size", "2", "--training.global_batch_size", "4"}),
                test_runtime());
  for (int s = 0; s < 4; ++s) {
    StepRecord a = big.step(), b = accum.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-10 * std::abs(a.loss)) << "step " << s + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-10 * std::abs(a.grad_norm)) << "step " << s + 1;
  }
  for (const ParamInfo& p : big.plan().params()) {
    std::vector<double> x = big.params().master_to_host(p.name).to_vector<double>();
    std::vector<double> y = accum.params().master_to_host(p.name).to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(x[i], y[i], 1e-10 * (1 + std::abs(x[i]))) << p.name << "[" << i << "]";
  }
}

// Whole-model gradcheck: the llama3 step graph (cpu_step.h) through every op at once, against
// central differences.
TEST(Llama3, WholeModelGradCheckFloat64) {
  const int64_t B = 2, S = 8;
  JobConfig cfg;
  cfg.model.flavor = "tiny";
  cfg.training.local_batch_size = B;
  cfg.training.seq_len = S;
  testing::CpuStep cs = testing::cpu_step(cfg,
                                          {.tokenizer_vocab = 258,
                                           .compute_dtype = DType::kF64,
                                           .master_dtype = DType::kF64,
                                           .reduce_dtype = DType::kF64},
                                          11);
  ParamStore& store = *cs.store;
  cs.prepare();
  std::mt19937 rng(5);
  for (const Tensor* t : {&cs.tokens(), &cs.labels()}) {
    int32_t* p = t->data<int32_t>();
    for (int64_t i = 0; i < B * S; ++i) p[i] = int32_t(rng() % 258);
  }
  cs.ex->run();
  const std::vector<std::string> names = {"tok_embeddings.weight",
                                          "layers.0.attention.wq.weight",
                                          "layers.0.attention.wk.weight",
                                          "layers.1.attention.wo.weight",
                                          "layers.0.attention_norm.weight",
                                          "layers.1.feed_forward.w1.weight",
                                          "layers.1.feed_forward.w2.weight",
                                          "norm.weight",
                                          "output.weight"};
  std::map<std::string, std::vector<double>> analytic;
  // The gradient sinks hold the first run's gradients (later runs add to them).
  for (const auto& n : names) analytic[n] = store.grad(n).to_vector<double>();
  for (const auto& n : names) {
    Tensor w = store.master(n);
    double* wp = w.data<double>();
    double max_diff = 0, max_num = 0;
    std::uniform_int_distribution<int64_t> pick(0, w.numel() - 1);
    for (int k = 0; k < 12; ++k) {
      int64_t i = pick(rng);
      double orig = wp[i];
      const double eps = 1e-5;  // loss ~5: 1e-6 leaves roundoff near 1e-6 relative
      wp[i] = orig + eps;
      cs.ex->run();
      double lp = cs.loss();
      wp[i] = orig - eps;
      cs.ex->run();
      double lm = cs.loss();
      wp[i] = orig;
      double num = (lp - lm) / (2 * eps);
      max_diff = std::max(max_diff, std::abs(num - analytic[n][size_t(i)]));
      max_num = std::max(max_num, std::abs(num));
    }
    EXPECT_LE(max_diff / std::max(max_num, 1e-3), 1e-6) << n << " max |numeric| " << max_num;
  }
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {
TEST(Init, AnyBlockEqualsTheSameSliceOfTheFullTensor) {
  const Shape global{5, 7, 3};
  InitSpec spec = InitSpec::trunc_normal(0.5, -0.6, 0.6);
  Tensor full = Tensor::empty(global, DType::kF64);
  init_local(full, global, LocalPiece{}, spec, 9, "w");
  // A 3 x 4 x 3 block at (3, 4, 0): rows 3..5 (row 5 is padding), cols 4..7 (col 7 padding).
  Tensor block = Tensor::empty(Shape{3, 4, 3}, DType::kF64);
  init_local(block, global, LocalPiece{{3, 4, 0}}, spec, 9, "w");
  const double* f = full.data<double>();
  const double* b = block.data<double>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 3; ++k) {
        double got = b[(i * 4 + j) * 3 + k];
        if (3 + i >= 5 || 4 + j >= 7)
          EXPECT_EQ(got, 0.0);
        else
          EXPECT_EQ(got, f[((3 + i) * 7 + (4 + j)) * 3 + k]);
      }
  for (int64_t i = 0; i < full.numel(); ++i) EXPECT_LE(std::abs(f[i]), 0.6);
}
}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {
// Recomputation repeats the same kernels on the same inputs: losses and norms are bitwise equal
// to the run without checkpointing, and the planned activation peak is lower.
TEST(ActivationCheckpoint, EveryModeGivesBitwiseIdenticalStepsAndFullUsesLessMemory) {
  const std::vector<std::vector<std::string>> modes = {
      {"--activation_checkpoint.mode", "none"},
      {"--activation_checkpoint.mode", "full"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option",
       "op"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option",
       "2"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option",
       "free"}};
  std::vector<std::vector<StepRecord>> runs;
  std::vector<int64_t> peak;
  for (const auto& m : modes) {
    std::vector<std::string> o = m;
    o.insert(o.end(), {"--model.n_layers", "4"});
    Trainer t(tiny_job(o), test_runtime());
    runs.emplace_back();
    for (int s = 0; s < 3; ++s) runs.back().push_back(t.step());
    peak.push_back(t.executor().plan().live_peak_bytes);
  }
  for (size_t r = 1; r < runs.size(); ++r)
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(runs[r][s].loss, runs[0][s].loss) << "mode " << r << " step " << s + 1;
      EXPECT_EQ(runs[r][s].grad_norm, runs[0][s].grad_norm) << "mode " << r << " step " << s + 1;
    }
  EXPECT_LT(peak[1], peak[0]);
  EXPECT_LT(peak[2], peak[0]);
  EXPECT_LT(peak[3], peak[0]);
  EXPECT_LT(peak[1], peak[2]) << "full recomputes more than per-op selective";
  EXPECT_LT(peak[4], peak[0]) << "\"free\" recomputes the norms and SwiGLU products";
}
}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {
TEST(Init, ThreadedFillEqualsRowByRowFill) {
  const Shape global{2100, 1000};  // > 2M elements: filled by several threads
  Tensor full = Tensor::empty(global, DType::kF32);
  init_local(full, global, LocalPiece{}, InitSpec::normal(0.02), 5, "big");
  for (int64_t row : {0, 1049, 1050, 2099}) {
    Tensor one = Tensor::empty(Shape{1, 1000}, DType::kF32);
    init_local(one, global, LocalPiece{{row, 0}}, InitSpec::normal(0.02), 5, "big");
    for (int64_t k = 0; k < 1000; ++k)
      ASSERT_EQ(one.data<float>()[k], full.data<float>()[row * 1000 + k]) << row << "," << k;
  }
}
}  // namespace
}  // namespace meshtrain
