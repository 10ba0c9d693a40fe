// The optimizer against independent arithmetic: torchtitan's LR schedule (warmup, stable, three
// decay shapes, min_lr_factor), torch.optim.AdamW's update with bias correction and decoupled
// weight decay, and global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/graph/executor.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain {
namespace {

TEST(LrSchedule, WarmupThenLinearDecayAsTorchtitan) {
  LrSchedule s({.lr = 1.0,
                .warmup_steps = 4,
                .decay_type = LrDecay::kLinear,
                .min_lr_factor = 0.0,
                .training_steps = 10});
  // warmup: (step+1)/(warmup+1); decay over 6 steps: progress = (step+1-4)/(6+1)
  EXPECT_DOUBLE_EQ(s.factor(0), 1.0 / 5);
  EXPECT_DOUBLE_EQ(s.factor(3), 4.0 / 5);
  EXPECT_DOUBLE_EQ(s.factor(4), 1.0 - 1.0 / 7);
  EXPECT_DOUBLE_EQ(s.factor(9), 1.0 - 6.0 / 7);
  EXPECT_DOUBLE_EQ(s.lr_at_step(1), 1.0 / 5);  // optimizer step 1 uses factor(0)
}

TEST(LrSchedule, StablePhaseSqrtCosineAndMinFactor) {
  LrSchedule wsd({.lr = 2.0,
                  .warmup_steps = 2,
                  .decay_ratio = 0.5,
                  .decay_type = LrDecay::kCosine,
                  .min_lr_factor = 0.1,
                  .training_steps = 10});
  // decay 5 steps, stable 3 (steps 2..4)
  EXPECT_DOUBLE_EQ(wsd.factor(2), 1.0);
  EXPECT_DOUBLE_EQ(wsd.factor(4), 1.0);
  double p = (5.0 + 1 - 5) / 6;
  EXPECT_DOUBLE_EQ(wsd.factor(5), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * p)));
  LrSchedule sq({.lr = 1.0, .warmup_steps = 0, .decay_type = LrDecay::kSqrt, .training_steps = 4});
  EXPECT_DOUBLE_EQ(sq.factor(1), 1.0 - std::sqrt(2.0 / 5));
  // An unknown shape cannot reach the schedule: the config edge refuses it.
  EXPECT_THROW(parse_job_config("", {"--lr_scheduler.decay_type", "exp"}), ConfigError);
}

TEST(AdamW, TwoStepsMatchTorchArithmeticWithClipping) {
  ParallelPlan plan(PlanConfig{DType::kF64, DType::kF64, DType::kF64}, nullptr);
  Graph g;
  Builder b(g);
  plan.param(b, "w", Shape{3}, InitSpec::constant(0.5));
  GradientMap fake;
  fake.grads[plan.info("w").master] = b.input("g", {Shape{3}, DType::kF64});
  plan.attach_gradients(b, fake);
  auto backend = create_backend("cpu", 0);
  ParamStore store(plan, *backend);
  store.initialize(1);
  ops::AdamWParams hp{
      .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_norm = 1.0};
  Optimizer opt(store, hp, *backend, nullptr);

  std::vector<double> p = {0.5, 0.5, 0.5}, m(3, 0), v(3, 0);
  const std::vector<std::vector<double>> grads = {{3.0, -4.0, 0.0}, {0.1, 0.2, -0.2}};
  const double lr = 0.01;
  for (int step = 1; step <= 2; ++step) {
    const auto& gr = grads[size_t(step - 1)];
    double* gp = store.grad("w").data<double>();
    for (int i = 0; i < 3; ++i) gp[i] = gr[size_t(i)];
    opt.step(step, lr);
    double norm = std::sqrt(gr[0] * gr[0] + gr[1] * gr[1] + gr[2] * gr[2]);
    EXPECT_DOUBLE_EQ(opt.last_grad_norm(), norm);
    double clip = std::min(1.0, 1.0 / (norm + 1e-6));
    for (int i = 0; i < 3; ++i) {
      double gi = gr[size_t(i)] * clip;
      p[size_t(i)] *= 1 - lr * 0.1;
      m[size_t(i)] = 0.9 * m[size_t(i)] + 0.1 * gi;
      v[size_t(i)] = 0.95 * v[size_t(i)] + 0.05 * gi * gi;
      double mhat = m[size_t(i)] / (1 - std::pow(0.9, step));
      double denom = std::sqrt(v[size_t(i)]) / std::sqrt(1 - std::pow(0.95, step)) + 1e-8;
      p[size_t(i)] -= lr * mhat / denom;
    }
    std::vector<double> got = store.master("w").to_vector<double>();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[size_t(i)], p[size_t(i)], 1e-15) << "step " << step;
    for (double x : store.grad("w").to_vector<double>()) EXPECT_EQ(x, 0.0) << "grads reset";
  }
}

TEST(AdamW, ClipCoefficientFollowsClipGradNorm) {
  EXPECT_DOUBLE_EQ(ops::clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ops::clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ops::clip_coefficient(4.0, 0.0), 1.0);  // max_norm 0: no clipping
}

}  // namespace
}  // namespace meshtrain
