// The parts of the training loss, as the trainer and the validator read them back, and the
// multi-token-prediction inputs they write (model/mtp.h): each depth's global target count and
// the MTP loss weight of the step. Rule: nothing here allocates or copies inside a step but the
// one 4- or 8-byte weight copy on the step where the [model] schedule changes the weight.
#pragma once

#include <vector>

#include "meshtrain/graph/executor.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/metrics.h"

namespace meshtrain {

// The loss accumulator of the step graph (train/step_graph.h): [total], or with D MTP depths
// [total, main, mtp_1 .. mtp_D].
struct LossParts {
  double total = 0;         // what training minimises
  double main = 0;          // the next-token loss (= total without MTP)
  std::vector<double> mtp;  // depth 1..D
};
// `sums` (a host copy of the accumulator), each element divided by `divisor`.
LossParts split_loss_sums(const Tensor& sums, double divisor = 1.0);

// The step line's and the JSON's MTP figures: m.mtp_losses, m.total_loss and m.mtp_loss_weight
// (nothing without MTP).
void set_mtp_metrics(const LossParts& parts, double weight, StepMetrics& m);

class MtpInputs {
 public:
  // The step graph's MTP inputs (kNoValue without MTP: every call below then does nothing).
  MtpInputs(ValueId token_count, ValueId loss_weight, const ModelSection& model);
  bool active() const { return count_ != kNoValue; }

  // After Executor::prepare, on stream 0: each depth's global number of valid targets among the
  // `targets` main targets of a step (rows of seq_len: k fewer per row at depth k), written
  // once, and the weight of step 1.
  void prepare(Executor& exec, int64_t targets, int64_t seq_len);
  // Before step `step`'s micro-batches: its weight ([model] mtp_loss_weight_at), copied on
  // stream 0 only when it differs from the one on the device.
  void begin_step(int64_t step);
  double weight() const { return weight_; }

 private:
  void write_weight(double w);
  ValueId count_ = kNoValue, weight_value_ = kNoValue;
  ModelSection model_;
  Executor* exec_ = nullptr;
  Tensor host_weight_;  // host staging of the weight (the device copy reads it)
  double weight_ = 0;
};

}  // namespace meshtrain
