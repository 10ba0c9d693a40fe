// What watches a training step without taking part in its arithmetic: the profiler's trace of
// every profile_freq-th step and the debug dump of one chosen step. Trainer::step calls the three
// hooks in order; an observer never changes a value the step computes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/graph/executor.h"
#include "meshtrain/train/debug_dump.h"
#include "meshtrain/train/moe_metrics.h"
#include "meshtrain/train/profiler.h"

namespace meshtrain {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;  // global mean token loss of the step (the main loss with MTP)
  // Multi-token prediction (empty without): each depth's loss, the loss the step minimised and
  // the weight it used ([model] mtp_loss_weight); total_loss = loss without MTP.
  std::vector<double> mtp_losses;
  double total_loss = 0, mtp_loss_weight = 0;
  double grad_norm = 0;  // global norm before clipping
  double lr = 0;
  // Non-finite loss or norm, update skipped ([training] skip_nonfinite_steps).
  bool skipped = false;
  // Expert-parallel exchanges of this step on this rank, and those that needed more rows than
  // planned ([parallelism] expert_capacity_factor; handled dropless, graph/row_capacity.h).
  int64_t expert_exchanges = 0;
  int64_t expert_overflows = 0;
  // [parallelism] expert_exchange = "padded": the step was redone synced because some rank's
  // padded blocks or slots overflowed (moe/padded_exchange.h).
  bool padded_replayed = false;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void before_step(int64_t /*step*/) {}        // before the first micro-batch
  virtual void after_backward(int64_t /*step*/) {}     // after the last backward, before the update
  virtual void after_step(const StepRecord& /*r*/) {}  // after the update and the loss read-back
};

// The observers of a run, called in the order they were added.
class StepObservers {
 public:
  void add(std::unique_ptr<StepObserver> o) { list_.push_back(std::move(o)); }
  void before_step(int64_t step);
  void after_backward(int64_t step);
  void after_step(const StepRecord& r);

 private:
  std::vector<std::unique_ptr<StepObserver>> list_;
};

// [profiling]: records every node of each `every`-th step's runs and writes the trace to
// `folder` (Profiler::write_trace) once the step's backward is done.
std::unique_ptr<StepObserver> make_profiling_observer(std::unique_ptr<Profiler> profiler,
                                                      Executor& exec, int64_t every,
                                                      std::string folder);

// [debug] dump_step: what the dump of the chosen step reads from the run.
struct DebugDumpSources {
  std::function<HfRunContext()> run;                 // weights and gradients, HF names
  std::function<std::vector<MoeLayerLoad>()> loads;  // expert loads (a host sync)
  DumpStepInfo fixed;  // seq_len, rows_per_step, windows_per_epoch, dataset (the rest per step)
  bool writes_summary = false;  // rank 0 writes dump.json
};
std::unique_ptr<StepObserver> make_debug_dump_observer(std::unique_ptr<DebugDump> dump,
                                                       DebugDumpSources sources);

}  // namespace meshtrain
