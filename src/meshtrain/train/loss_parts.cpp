// Loss parts and MTP inputs (see header).
#include "meshtrain/train/loss_parts.h"

#include "meshtrain/core/check.h"
#include "meshtrain/model/mtp.h"

namespace meshtrain {

double ModelSection::mtp_loss_weight_at(int64_t step) const {
  return mtp_loss_weight_after_step > 0 && step > mtp_loss_weight_after_step ? mtp_loss_weight_after
                                                                             : mtp_loss_weight;
}

void validate_mtp_config(const JobConfig& c) {
  const ModelSection& m = c.model;
  if (m.mtp_layers == 0) return;
  MT_CHECK_T(ConfigError, m.name == "deepseek_v3",
             "[model] mtp_layers = {}: multi-token prediction is a deepseek_v3 feature (its MTP "
             "modules are MLA + MoE blocks); [model] name \"{}\" has none, set mtp_layers = 0",
             m.mtp_layers, m.name);
  MT_CHECK_T(ConfigError, m.mtp_layers < c.training.seq_len,
             "[model] mtp_layers = {} needs [training] seq_len > {}: depth k predicts the token "
             "k + 1 ahead inside each row, found seq_len {}",
             m.mtp_layers, m.mtp_layers, c.training.seq_len);
  MT_CHECK_T(ConfigError, !c.validation.enable || m.mtp_layers < c.validation.seq_len,
             "[model] mtp_layers = {} needs [validation] seq_len > {}, found {}", m.mtp_layers,
             m.mtp_layers, c.validation.seq_len);
}

LossParts split_loss_sums(const Tensor& sums, double divisor) {
  LossParts p;
  const int64_t n = sums.numel();
  p.total = sums.item_as_double(0) / divisor;
  p.main = n > 1 ? sums.item_as_double(1) / divisor : p.total;
  for (int64_t i = 2; i < n; ++i) p.mtp.push_back(sums.item_as_double(i) / divisor);
  return p;
}

void set_mtp_metrics(const LossParts& parts, double weight, StepMetrics& m) {
  if (parts.mtp.empty()) return;
  m.mtp_losses = parts.mtp;
  m.total_loss = parts.total;
  m.mtp_loss_weight = weight;
}

MtpInputs::MtpInputs(ValueId token_count, ValueId loss_weight, const ModelSection& model)
    : count_(token_count), weight_value_(loss_weight), model_(model) {}

void MtpInputs::prepare(Executor& exec, int64_t targets, int64_t seq_len) {
  if (!active()) return;
  exec_ = &exec;
  Backend& backend = exec.backend();
  const Tensor& count = exec.tensor(count_);
  std::vector<int64_t> counts;
  for (int k = 1; k <= int(count.numel()); ++k)
    counts.push_back(mtp_valid_targets(targets, seq_len, k));
  const Tensor host = Tensor::from_vector(counts, count.shape());
  backend.copy(count.raw(), host.raw(), host.nbytes(), CopyKind::kHostToDevice, backend.stream(0));
  const Tensor& w = exec.tensor(weight_value_);
  host_weight_ = Tensor::empty(w.shape(), w.dtype(), backend.host_staging_allocator());
  write_weight(model_.mtp_loss_weight_at(1));
  // Host sync, once at start-up: the counts' pageable source is freed when this returns.
  backend.stream(0).synchronize();
}

void MtpInputs::begin_step(int64_t step) {
  if (!active()) return;
  const double w = model_.mtp_loss_weight_at(step);
  if (w != weight_) write_weight(w);
}

void MtpInputs::write_weight(double w) {
  weight_ = w;
  if (host_weight_.dtype() == DType::kF64)
    host_weight_.data<double>()[0] = w;
  else
    host_weight_.data<float>()[0] = float(w);
  // The staging buffer is rewritten only when the schedule changes the weight, steps after the
  // previous copy (every step ends with a host sync on stream 0, Trainer::read_step_loss).
  Backend& backend = exec_->backend();
  const Tensor& dst = exec_->tensor(weight_value_);
  backend.copy(dst.raw(), host_weight_.raw(), dst.nbytes(), CopyKind::kHostToDevice,
               backend.stream(0));
}

}  // namespace meshtrain
