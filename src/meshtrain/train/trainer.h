// Trainer: the spine. Build once (mesh, data, model graph, autodiff, passes, memory plan,
// parameters, optimizer), then run optimizer steps: A micro-batches of forward+backward, one
// fused AdamW pass, the LR schedule, and metrics every log_freq steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/manager.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/passes/activation_checkpoint.h"
#include "meshtrain/graph/passes/reshard_after_forward.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/model/counting.h"
#include "meshtrain/model/model.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/train/fault_guard.h"
#include "meshtrain/train/input_feeder.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/loss_parts.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/step_observers.h"

namespace meshtrain {

class Validator;

class Trainer {
 public:
  // Uses the runtime's world communicator of the device's backend (MPI for cpu, NCCL for cuda),
  // created with the [comm] timeouts.
  Trainer(const JobConfig& cfg, Runtime& runtime);
  // Runs over any world communicator (tests run a 1-rank reference beside an N-rank run).
  Trainer(const JobConfig& cfg, Communicator& world, const LaunchInfo& launch);
  ~Trainer();

  // Runs [training] steps steps with logging; returns every logged step. Stops early, after a
  // step every rank agrees on, when a stop signal arrived (interrupted() then names it).
  std::vector<StepRecord> train();
  // One optimizer step. Loss and norm are read back every step (the non-finite check); a
  // non-finite one throws NonFiniteError or skips the update ([training] skip_nonfinite_steps).
  StepRecord step();
  // The stop signal (SIGTERM, SIGINT, SIGUSR2) that ended train() early; 0 when it ran to the end.
  int interrupted() const { return interrupted_; }
  // The validation pass after the last step ([validation] enable), for tests.
  Validator* validator() { return validator_.get(); }

  const ParallelPlan& plan() const { return *plan_; }
  const ParamStore& params() const { return *store_; }
  const Executor& executor() const { return *exec_; }
  Executor& executor() { return *exec_; }  // tests: node observers
  const Graph& graph() const { return graph_; }
  const ModelCounts& counts() const { return counts_; }
  // Expert load of every MoE layer in the last step (empty for dense models). Copies the small
  // per-layer counts to the host: a host sync, for logging steps and tests.
  std::vector<MoeLayerLoad> moe_load();
  int64_t steps_done() const { return step_; }
  // Where start-up resumed ([checkpoint]); loaded = false for a fresh run.
  const ResumePoint& resumed() const { return resumed_; }
  // Waits for a checkpoint save in flight and makes it visible (train() does before returning).
  void wait_for_checkpoint();
  int64_t tokens_per_step() const { return tokens_per_step_; }

 private:
  class Services;
  // The start-up sequence, in the order the constructor runs it (train/trainer_startup.cpp).
  void open_backend(Communicator& world);
  void make_mesh(Communicator& world);
  void open_data();
  void build_graph();
  void bind_executor();
  void make_optimizer();
  void write_run_files() const;
  void make_metrics();
  void make_observers();
  void make_validator();
  void log_startup() const;
  void start_checkpointing(const ParallelDims& dims);

  // The step's parts (train/trainer.cpp, train/padded_replay.cpp).
  void zero_step_loss();
  void run_micro_batches();
  // All micro-batches of the step; with the padded exchange, redone synced when some rank's
  // padded blocks overflowed. Fills r's exchange counts and padded_replayed.
  void run_step_micro_batches(StepRecord& r);
  // [parallelism] expert_exchange = "padded": true when a padded exchange of any rank overflowed
  // in this step's micro-batches (one all-reduce and host wait per step, before the optimizer).
  bool padded_exchange_overflowed();
  // Redoes this step's micro-batches from `data_at` with the synced exchange (dropless).
  void replay_step_synced(const TokenLoader::State& data_at);
  // Warns about exchanges that needed more rows than planned since `before`.
  void record_exchange_overflows(const RowCapacityStats& before, StepRecord& r) const;
  LossParts read_step_loss();
  void log_step(const StepRecord& r, double elapsed, int64_t steps_since);
  HfRunContext hf_context();
  const std::string& dump_folder() const { return cfg_.job.dump_folder; }

  JobConfig cfg_;
  LaunchInfo launch_;
  int rank_ = 0, world_size_ = 1;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FaultGuard> fault_;  // after backend_: its flag tensors are the backend's
  int interrupted_ = 0;
  std::unique_ptr<DeviceMesh> mesh_;
  std::unique_ptr<GroupLayout> layout_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TokenLoader> loader_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ParallelPlan> plan_;
  Graph graph_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<InputFeeder> feeder_;
  std::unique_ptr<MtpInputs> mtp_;  // the MTP inputs (inactive without multi-token prediction)
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<MetricsLogger> metrics_;
  StepObservers observers_;        // [profiling], [debug] dump_step
  StepGraphOptions step_options_;  // the graph's options, which validation's graph shares too
  std::unique_ptr<Validator> validator_;  // [validation] enable
  std::unique_ptr<CheckpointManager> checkpointer_;
  ResumePoint resumed_;
  // Optimizer (AdamW bias correction) and LR-schedule positions minus step_: 0 unless a resume
  // left a part fresh ([checkpoint] exclude_from_loading, model-only loads).
  int64_t optimizer_offset_ = 0, lr_offset_ = 0;
  // Whether step `step`'s update may still run when step() returns (overlap_next_step): only
  // inside train(), with nothing but the next step after it (no validation, save, dump).
  bool update_may_overlap(int64_t step) const;
  bool in_train_loop_ = false;
  int overlap_waits_ = 0;  // the step graph's waits on the update's slices (startup log)
  ModelCounts counts_;
  ReshardStats reshard_;
  CheckpointStats checkpoint_;
  int fused_grad_matmuls_ = 0;
  DType compute_dtype_ = DType::kF32, master_dtype_ = DType::kF32, reduce_dtype_ = DType::kF32;
  ValueId tokens_ = kNoValue, labels_ = kNoValue, token_count_ = kNoValue, loss_ = kNoValue;
  ValueId loss_sum_ = kNoValue;
  ValueId mtp_token_count_ = kNoValue, mtp_loss_weight_ = kNoValue;  // graph inputs of MTP
  Tensor loss_sum_buffer_, host_scalar_;
  // The padded expert exchange's device overflow counter (undefined when synced) and its host copy.
  Tensor ep_overflow_, host_overflow_;
  int64_t padded_replays_ = 0;
  Tensor host_load_;  // staging for moe_load(): every MoE layer's counts, back to back
  int64_t accum_steps_ = 1, tokens_per_step_ = 0, step_ = 0;
  std::vector<std::string> notes_;  // start-up notes of the run (stand-in tokenizer, data)
};

// Resolves [job] device "auto" and the compute/master/reduce dtypes for that device, with the
// errors a user can hit (bf16 compute on the cpu backend, ...).
DeviceType resolve_device(DeviceChoice device);
// "cpu" | "cuda": the backend registry's name of a resolved device, as messages print it.
const char* device_backend_name(DeviceType device);
// nullopt ("auto"): the device's default.
DType resolve_compute_dtype(std::optional<DType> mixed_precision_param, DeviceType device);

}  // namespace meshtrain
