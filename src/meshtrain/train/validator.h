// Validator: [validation] as torchtitan defines it. A forward-only graph of the same model on the
// held-out data, bound to the training master tensors (weights and expert bias are shared, never
// copied); after step 1 and every `freq` steps it runs `steps` batches and reports the mean token
// loss. It never changes training: its load counters and loss accumulator are its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/loader.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/input_feeder.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {

class Validator {
 public:
  // `options` are the training graph's (dtypes, vocabulary); `world` sums the loss over ranks.
  Validator(const JobConfig& cfg, const GroupLayout* layout, const StepGraphOptions& options,
            const Tokenizer& tokenizer, const ParamStore& store, Backend& backend,
            ExecServices* services, Communicator& world, int64_t dp_rank, int64_t dp);

  bool due(int64_t step) const { return step == 1 || step % freq_ == 0; }
  // One validation pass after training step `step`.
  ValidationMetrics run(int64_t step);

  int64_t batches_per_pass() const { return batches_; }
  const std::string& description() const { return description_; }  // for the start-up log
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  Backend& backend_;
  Communicator& world_;
  std::unique_ptr<StepGraph> sg_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<TokenLoader> loader_;
  std::unique_ptr<InputFeeder> feeder_;
  std::vector<Tensor> own_state_;  // load counters and the loss accumulator, zeroed per pass
  Tensor loss_sum_, host_scalar_;
  int64_t freq_ = 1, batches_ = 0, tokens_per_batch_ = 0, local_tokens_ = 0, non_dp_ = 1;
  bool whole_pass_ = false;  // steps = -1: every pass starts at the first held-out window
  std::string description_;
  std::vector<std::string> notes_;
};

}  // namespace meshtrain
