// The padded expert exchange's step-level guard (an overflow on any rank redoes the step with
// the synced exchange) and the dropless exchanges' overflow report of the step.
#include "meshtrain/core/logging.h"
#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

void Trainer::run_step_micro_batches(StepRecord& r) {
  const RowCapacityStats rows_before = exec_->row_capacity_stats();
  TokenLoader::State data_at;
  if (ep_overflow_.defined()) {
    data_at = loader_->state();
    backend_->fill_zero(ep_overflow_.raw(), ep_overflow_.nbytes(), backend_->stream(0));
  }
  run_micro_batches();
  r.padded_replayed = ep_overflow_.defined() && padded_exchange_overflowed();
  if (r.padded_replayed) replay_step_synced(data_at);
  record_exchange_overflows(rows_before, r);
}

void Trainer::record_exchange_overflows(const RowCapacityStats& before, StepRecord& r) const {
  const RowCapacityStats after = exec_->row_capacity_stats();
  r.expert_exchanges = after.fits - before.fits;
  r.expert_overflows = after.overflows - before.overflows;
  if (r.expert_overflows > 0)
    log_warn(
        "rank {} step {}: {} of {} expert exchanges received more rows than planned (most so far "
        "{:.2f}x the plan; [parallelism] expert_capacity_factor {}); handled dropless from a pool "
        "of {:.1f} MiB (grown {} times in all)",
        rank_, step_, r.expert_overflows, r.expert_exchanges, after.max_fill,
        cfg_.parallelism.expert_capacity_factor, double(after.pool_bytes) / (1 << 20), after.grows);
}

bool Trainer::padded_exchange_overflowed() {
  Stream& s = backend_->stream(0);
  mesh_->comm(MeshGroup::kWorld).all_reduce(ep_overflow_, ReduceOp::kSum, s);
  backend_->copy(host_overflow_.raw(), ep_overflow_.raw(), 4, CopyKind::kDeviceToHost, s);
  // Host sync, once per step and only with the padded exchange: every rank must know before the
  // optimizer whether some rank dropped rows, so that all redo the step or none does.
  s.synchronize();
  return host_overflow_.data<float>()[0] > 0;
}

void Trainer::replay_step_synced(const TokenLoader::State& data_at) {
  ++padded_replays_;
  if (rank_ == 0)  // every rank knows the same global count
    log_warn(
        "step {}: {} padded expert blocks or slots held more rows than planned ([parallelism] "
        "expert_capacity_factor {}); redoing the step with the synced exchange (steps redone so "
        "far: {} of {}){}",
        step_, int64_t(host_overflow_.data<float>()[0]), cfg_.parallelism.expert_capacity_factor,
        padded_replays_, step_,
        padded_replays_ == 1 ? "; a redone step costs a second pass: raise the factor above the "
                               "step lines' moe load max/mean, or use expert_exchange = \"synced\""
                             : "");
  // Host sync: the first pass's last gradient reductions may still run on the communication
  // streams, which the zeroing below on stream 0 is not ordered after (a replay is rare).
  backend_->synchronize();
  Stream& s = backend_->stream(0);
  // Everything the micro-batches accumulated goes back to zero: the loss, the gradients (when
  // several micro-batches add into them), the routed-token counters of the bias update. (The
  // counters' views and the warning above allocate on the host: only in a redone step.)
  backend_->fill_zero(loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(), s);
  if (accum_steps_ > 1)
    for (ParamGroup& g : store_->groups()) backend_->fill_zero(g.grad.raw(), g.grad.nbytes(), s);
  for (const LoadBalanceLayer& l : plan_->load_balance_layers()) {
    Tensor t = store_->master(l.tokens_per_expert);
    backend_->fill_zero(t.raw(), t.nbytes(), s);
  }
  loader_->restore(data_at);
  ops::set_ep_exchange_synced(graph_, true);
  run_micro_batches();
  ops::set_ep_exchange_synced(graph_, false);
}

}  // namespace meshtrain
