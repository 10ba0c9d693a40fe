// Trainer::step, the spine of one optimizer step (micro-batches, optimizer, loss and norm,
// faults, checkpoint), and the loop that runs the steps and logs them.
#include "meshtrain/train/trainer.h"

#include <algorithm>
#include <chrono>

#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/train/validator.h"

namespace meshtrain {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

StepRecord Trainer::step() {
  StepRecord r{.step = ++step_};
  fault_->begin_step(step_);
  // Masters written since the last step (a resume, an HF load): their compute copies follow,
  // after any update still running beside (overlap_next_step) has written its copies.
  if (store_->copies_stale()) optimizer_->join(backend_->stream(0));
  store_->sync_compute_copies();
  observers_.before_step(step_);
  zero_step_loss();
  mtp_->begin_step(step_);
  run_step_micro_batches(r);
  observers_.after_backward(step_);
  r.lr = schedule_->lr_at_step(step_ + lr_offset_);
  fault_->before_optimizer(step_, *store_);
  optimizer_->step(step_ + optimizer_offset_, r.lr);
  // Every step: a NaN/Inf is caught on the step it appears (the AdamW kernels already skipped
  // the update on a non-finite norm). A skipped step does not advance the Adam step.
  const LossParts losses = read_step_loss();
  r.loss = losses.main;
  r.total_loss = losses.total;
  r.mtp_losses = losses.mtp;
  r.mtp_loss_weight = mtp_->weight();
  r.grad_norm = optimizer_->last_grad_norm();
  r.skipped = fault_->after_optimizer(step_, r.total_loss, r.grad_norm, *checkpointer_);
  if (r.skipped) --optimizer_offset_;
  // Under [optimizer] overlap_next_step only the next step's graph runs beside the update (it
  // waits slice by slice); anything else that reads the weights or the state orders after it all.
  if (optimizer_->overlaps() && !update_may_overlap(step_)) optimizer_->join(backend_->stream(0));
  observers_.after_step(r);
  checkpointer_->after_step(step_, step_ + optimizer_offset_, step_ + lr_offset_, r.lr);
  return r;
}

bool Trainer::update_may_overlap(int64_t step) const {
  return in_train_loop_ && step < cfg_.training.steps && cfg_.debug.dump_step <= 0 &&
         !(validator_ && validator_->due(step)) && !checkpointer_->saves_at(step);
}

void Trainer::zero_step_loss() {
  backend_->fill_zero(loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(), backend_->stream(0));
}

void Trainer::run_micro_batches() {
  for (int64_t m = 0; m < accum_steps_; ++m) {
    feeder_->feed(*loader_);
    exec_->run();
  }
}

LossParts Trainer::read_step_loss() {
  Stream& s = backend_->stream(0);
  // The step's loss is summed over micro-batches on this rank; the global mean is the sum over
  // every rank, since each already divided by the global count: data-parallel ranks hold other
  // sequences, tensor-parallel ranks other token shards (sequence parallel).
  mesh_->comm(MeshGroup::kWorld).all_reduce(loss_sum_buffer_, ReduceOp::kSum, s);
  backend_->copy(host_scalar_.raw(), loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(),
                 CopyKind::kDeviceToHost, s);
  // Host sync, every step: the non-finite check ([training] skip_nonfinite_steps, the default
  // stop) must see the loss of the step it appears in, and the log line reuses it.
  s.synchronize();
  return split_loss_sums(host_scalar_);
}

HfRunContext Trainer::hf_context() {
  return HfRunContext{
      *model_, *plan_, *store_, *backend_, cfg_.training.seq_len, compute_dtype_, rank_, [this] {
        mesh_->comm(MeshGroup::kWorld).barrier();
      }};
}

void Trainer::wait_for_checkpoint() { checkpointer_->wait(); }

std::vector<MoeLayerLoad> Trainer::moe_load() {
  std::vector<MoeLayerLoad> out;
  const auto& layers = plan_->load_balance_layers();
  if (layers.empty()) return out;
  Stream& s = backend_->stream(0);
  optimizer_->join_state(s);  // the counts are the update's (it may still run on its stream)
  size_t offset = 0;
  for (const LoadBalanceLayer& l : layers) {
    Tensor t = store_->master(l.last_load);
    backend_->copy(static_cast<char*>(host_load_.raw()) + offset, t.raw(), t.nbytes(),
                   CopyKind::kDeviceToHost, s);
    offset += t.nbytes();
  }
  // Host sync: the per-expert counts are read for the log line and metrics (logging steps).
  s.synchronize();
  int64_t at = 0;
  for (const LoadBalanceLayer& l : layers) {
    std::vector<double> tokens(static_cast<size_t>(l.num_experts));
    for (int64_t e = 0; e < l.num_experts; ++e)
      tokens[size_t(e)] = host_load_.item_as_double(at + e);
    at += l.num_experts;
    out.push_back(summarize_moe_load(l.layer, l.block, std::move(tokens)));
  }
  return out;
}

void Trainer::log_step(const StepRecord& r, double elapsed, int64_t steps_since) {
  StepMetrics m;
  m.step = r.step;
  m.loss = r.loss;
  set_mtp_metrics({r.total_loss, r.loss, r.mtp_losses}, r.mtp_loss_weight, m);
  m.grad_norm = r.grad_norm;
  m.lr = r.lr;
  m.step_time_s = elapsed / double(steps_since);
  const int non_dp = plan_->group_size(MeshGroup::kCp) * plan_->group_size(MeshGroup::kTp);
  double local_tokens =
      double(cfg_.training.local_batch_size * cfg_.training.seq_len * accum_steps_ * steps_since);
  m.tps = local_tokens / elapsed / double(non_dp);
  m.tflops = counts_.flops_per_token * m.tps / 1e12;
  const double peak = backend_->peak_flops(compute_dtype_);
  m.mfu = peak > 0 ? 100.0 * counts_.flops_per_token * m.tps / peak : -1.0;
  m.memory_gib = double(backend_->allocator().peak_bytes()) / double(1ull << 30);
  m.memory_pct = 100.0 * double(backend_->allocator().peak_bytes()) /
                 double(std::max<int64_t>(backend_->memory_capacity(), 1));
  add_moe_load_metrics(moe_load(), m);
  if (cfg_.training.skip_nonfinite_steps) {
    m.extra["skipped_steps"] = double(fault_->skipped_steps());
    m.summary_suffix += fmt::format("{}skipped steps: {}", m.summary_suffix.empty() ? "" : "  ",
                                    fault_->skipped_steps());
  }
  if (r.expert_exchanges > 0) m.extra["moe.capacity_overflows"] = double(r.expert_overflows);
  if (ep_overflow_.defined()) m.extra["moe.padded_replays"] = double(padded_replays_);
  metrics_->log(m);
}

std::vector<StepRecord> Trainer::train() {
  std::vector<StepRecord> logged;
  const int64_t log_freq = std::max<int64_t>(1, cfg_.metrics.log_freq);
  auto t_last = std::chrono::steady_clock::now();
  int64_t steps_since = 0;
  in_train_loop_ = true;
  while (step_ < cfg_.training.steps) {
    bool log_now =
        (step_ + 1) % log_freq == 0 || step_ == resumed_.step || step_ + 1 == cfg_.training.steps;
    StepRecord r = step();
    ++steps_since;
    if (log_now) {
      log_step(r, seconds_since(t_last), steps_since);
      logged.push_back(r);
      t_last = std::chrono::steady_clock::now();
      steps_since = 0;
    }
    if (validator_ && validator_->due(r.step)) {
      // After the optimizer step (and its log line), as torchtitan does; its time is not the
      // training steps'.
      const auto t_val = std::chrono::steady_clock::now();
      metrics_->log_validation(validator_->run(r.step));
      t_last += std::chrono::steady_clock::now() - t_val;
    }
    if (fault_->stop_agreed()) {
      // Every rank stops after this same step: save it (unless it was just saved), then exit.
      optimizer_->join(backend_->stream(0));
      interrupted_ = fault_->stop_signal();
      checkpointer_->save_now(step_, step_ + optimizer_offset_, step_ + lr_offset_, r.lr);
      break;
    }
  }
  in_train_loop_ = false;
  backend_->synchronize();  // every stream: the update's too
  checkpointer_->wait();
  if (interrupted_ != 0) {
    const std::string saved = checkpointer_->latest_complete();
    log_info("training interrupted by {} after step {} of {}: {}; exiting with status {}",
             signal_name(interrupted_), step_, cfg_.training.steps,
             saved.empty() ? std::string("checkpointing is off, nothing saved")
                           : fmt::format("latest checkpoint {}", saved),
             kExitInterrupted);
    return logged;
  }
  log_info("training done: {} steps", step_);
  return logged;
}

}  // namespace meshtrain
