// One rank's training step on the CPU backend, for tests that drive it without the Trainer (their
// own data, optimizer or gradient checks): the graph is build_step_graph's, the one place the step
// is assembled; beside it the executor over its memory plan and a ParamStore bound to it.
#pragma once

#include <memory>

#include "meshtrain/graph/executor.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain::testing {

struct CpuStep {
  // Destroyed bottom up: the executor and the store before the backend and graph they use.
  std::unique_ptr<StepGraph> sg;
  std::unique_ptr<Backend> backend;
  Tensor loss_sum;  // the step's loss accumulator, bound here as the trainer binds it
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<Executor> ex;

  ParallelPlan& plan() const { return *sg->plan; }
  // Binds the store to the executor, prepares it and sets the token count to one micro-batch
  // (batch x seq_len). Masters edited before or after stay bound.
  void prepare();
  // Valid after prepare.
  const Tensor& tokens() const { return ex->tensor(sg->tokens); }
  const Tensor& labels() const { return ex->tensor(sg->labels); }
  double loss() const { return ex->tensor(sg->loss).item_as_double(); }
};

// The step of `cfg` (its [training] local_batch_size and seq_len, its passes) with `options`
// (dtypes, make_model); the loss stays readable after each run; masters initialised from `seed`.
CpuStep cpu_step(const JobConfig& cfg, const StepGraphOptions& options, uint64_t seed);

}  // namespace meshtrain::testing
