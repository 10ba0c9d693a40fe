// LR schedule arithmetic (see lr_schedule.h for the convention).
#include "meshtrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace meshtrain {

LrSchedule::LrSchedule(const LrScheduleConfig& c) : config_(c) {
  warmup_ = c.warmup_steps;
  decay_ = c.decay_ratio >= 0 ? int64_t(std::llround(double(c.training_steps) * c.decay_ratio))
                              : c.training_steps - warmup_;
  decay_ = std::max<int64_t>(decay_, 0);
  stable_ = std::max<int64_t>(c.training_steps - warmup_ - decay_, 0);
}

double LrSchedule::factor(int64_t step) const {
  const int64_t warm_stable = warmup_ + stable_;
  step = std::min(step, warm_stable + decay_);
  if (step < warmup_) return double(step + 1) / double(warmup_ + 1);
  if (step < warm_stable || decay_ == 0) return 1.0;
  double progress = double(step + 1 - warm_stable) / double(decay_ + 1);
  double adj = 0.0;
  switch (config_.decay_type) {
    case LrDecay::kLinear: adj = 1.0 - progress; break;
    case LrDecay::kSqrt: adj = 1.0 - std::sqrt(progress); break;
    case LrDecay::kCosine: adj = 0.5 * (1.0 + std::cos(M_PI * progress)); break;
  }
  return config_.min_lr_factor + (1.0 - config_.min_lr_factor) * adj;
}

}  // namespace meshtrain
