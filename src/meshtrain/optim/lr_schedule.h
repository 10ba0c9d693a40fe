// Learning-rate schedule: torchtitan's linear warmup → stable → decay (linear, sqrt or cosine)
// down to min_lr_factor. Optimizer step t (1-based) uses factor(t - 1), as LambdaLR does.
#pragma once

#include <cstdint>

namespace meshtrain {

enum class LrDecay : uint8_t { kLinear, kSqrt, kCosine };

struct LrScheduleConfig {
  double lr = 8e-4;
  int64_t warmup_steps = 200;
  double decay_ratio = -1;  // < 0: decay over every step after warmup
  LrDecay decay_type = LrDecay::kLinear;
  double min_lr_factor = 0.0;
  int64_t training_steps = 1;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& c);
  // Multiplicative factor for the scheduler's `current_step` (0-based).
  double factor(int64_t current_step) const;
  // Learning rate of optimizer step `step` (1-based).
  double lr_at_step(int64_t step) const { return config_.lr * factor(step - 1); }

 private:
  LrScheduleConfig config_;
  int64_t warmup_, stable_, decay_;
};

}  // namespace meshtrain
