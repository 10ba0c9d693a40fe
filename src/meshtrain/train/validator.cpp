// Validator (see header): the held-out loss (and each MTP depth's), read back once per pass.
#include "meshtrain/train/validator.h"

#include <chrono>
#include <set>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/train/loss_parts.h"
#include "meshtrain/train/torchtitan_assets.h"

namespace meshtrain {

Validator::Validator(const JobConfig& cfg, const GroupLayout* layout,
                     const StepGraphOptions& options, const Tokenizer& tokenizer,
                     const ParamStore& store, Backend& backend, ExecServices* services,
                     Communicator& world, int64_t dp_rank, int64_t dp)
    : backend_(backend), world_(world) {
  const ValidationSection& v = cfg.validation;
  freq_ = v.freq;
  const DatasetChoice data = choose_dataset("validation", v.dataset, v.dataset_path);
  if (!data.note.empty()) notes_.push_back(data.note);
  loader_ = std::make_unique<TokenLoader>(open_dataset(data, cfg.training.dataset_text_field),
                                          tokenizer, v.seq_len, v.local_batch_size, dp_rank, dp, 1,
                                          uint64_t(cfg.training.seed));
  const int64_t per_batch = v.local_batch_size * dp;
  whole_pass_ = v.steps == -1;
  batches_ = whole_pass_ ? loader_->windows_per_epoch() / per_batch : v.steps;
  MT_CHECK_T(DataError, batches_ >= 1,
             "[validation] dataset: {} holds {} windows of seq_len + 1 = {} tokens, fewer than one "
             "batch of local_batch_size x dp = {}",
             loader_->description(), loader_->windows_per_epoch(), v.seq_len + 1, per_batch);
  tokens_per_batch_ = per_batch * v.seq_len;
  local_tokens_ = v.local_batch_size * v.seq_len;
  description_ =
      fmt::format("{}; {} batches of {} x {} per pass{}, after step 1 and every {} steps",
                  loader_->description(), batches_, per_batch, v.seq_len,
                  whole_pass_ ? " (all of it)" : "", freq_);

  StepGraphOptions o = options;
  o.overwrite_grads = false;
  // Synced expert exchange: a padded one could drop rows, and validation has no replay.
  JobConfig synced = cfg;
  synced.parallelism.expert_exchange = ExpertExchange::kSynced;
  sg_ = build_forward_graph(synced, layout, o, v.local_batch_size, v.seq_len);
  non_dp_ = sg_->plan->group_size(MeshGroup::kCp) * sg_->plan->group_size(MeshGroup::kTp);
  MT_CHECK_T(DataError, int64_t(loader_->max_token_id()) < sg_->model->vocab_size(),
             "[validation] dataset: token id {} is outside the model's vocabulary of {} ids ({})",
             loader_->max_token_id(), sg_->model->vocab_size(), loader_->description());
  exec_ = std::make_unique<Executor>(sg_->graph, plan_memory(sg_->graph, backend.device().type),
                                     backend, services);
  // Weights and the expert bias are the training tensors; the counters the forward accumulates
  // into (tokens per expert, last load) are this graph's own, so validation never moves training.
  std::set<std::string> counters;
  for (const LoadBalanceLayer& l : sg_->plan->load_balance_layers())
    counters.insert({l.tokens_per_expert, l.last_load});
  for (const ParamInfo& p : sg_->plan->params()) {
    if (p.master == kNoValue) continue;
    if (p.trainable || !counters.count(p.name)) {
      exec_->bind(p.master, store.master(p.name));
      if (p.compute != kNoValue) exec_->bind(p.compute, store.compute_copy(p.name));
    } else {
      own_state_.push_back(Tensor::empty(p.local_shape, p.dtype, backend.allocator()));
      exec_->bind(p.master, own_state_.back());
    }
  }
  const TensorMeta& lm = sg_->graph.value(sg_->loss_sum).meta;
  loss_sum_ = Tensor::empty(lm.shape, lm.dtype, backend.allocator());
  own_state_.push_back(loss_sum_);
  exec_->bind(sg_->loss_sum, loss_sum_);
  exec_->prepare();
  host_scalar_ = Tensor::empty(lm.shape, lm.dtype, backend.host_staging_allocator());
  // Each batch's loss is divided by the global token count of a batch, written once.
  Tensor count = Tensor::from_vector(std::vector<int64_t>{tokens_per_batch_}, Shape{1});
  backend.copy(exec_->tensor(sg_->token_count).raw(), count.raw(), 8, CopyKind::kHostToDevice,
               backend.stream(0));
  feeder_ = std::make_unique<InputFeeder>(backend, exec_->tensor(sg_->tokens),
                                          exec_->tensor(sg_->labels));
  // MTP: each depth's losses are divided by its own count of a batch; the weight enters only the
  // total, which validation does not report.
  MtpInputs(sg_->mtp_token_count, sg_->mtp_loss_weight, cfg.model)
      .prepare(*exec_, tokens_per_batch_, v.seq_len);
}

ValidationMetrics Validator::run(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  Stream& s = backend_.stream(0);
  for (const Tensor& t : own_state_) backend_.fill_zero(t.raw(), t.nbytes(), s);
  if (whole_pass_) loader_->restore(TokenLoader::State{});
  for (int64_t b = 0; b < batches_; ++b) {
    feeder_->feed(*loader_);
    exec_->run();
  }
  // Every rank's sum is already divided by the global count of its batch: the sum over the ranks
  // is the mean token loss of each batch, added over the batches.
  world_.all_reduce(loss_sum_, ReduceOp::kSum, s);
  backend_.copy(host_scalar_.raw(), loss_sum_.raw(), loss_sum_.nbytes(), CopyKind::kDeviceToHost,
                s);
  // Host sync: the validation loss is read for its log line, once per pass.
  s.synchronize();
  ValidationMetrics m;
  m.step = step;
  m.batches = batches_;
  const LossParts parts = split_loss_sums(host_scalar_, double(batches_));
  m.loss = parts.main;
  m.mtp_losses = parts.mtp;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Tokens per second per device, as torchtitan counts them: this rank's tokens over the ranks
  // that share them (tp and cp hold the same tokens).
  m.tps = double(local_tokens_ * batches_) / std::max(secs, 1e-9) / double(non_dp_);
  m.memory_gib = double(backend_.allocator().peak_bytes()) / double(1ull << 30);
  return m;
}

}  // namespace meshtrain
