// The training step graph of one micro-batch, built the same way for `train` and `plan`:
// inputs → model forward → loss → autodiff → gradient accumulation sinks → passes
// (dead-code elimination, FSDP reshard-after-forward). Shapes are this rank's local shapes.
#pragma once

#include <map>
#include <memory>

#include "meshtrain/graph/passes/activation_checkpoint.h"
#include "meshtrain/graph/passes/reshard_after_forward.h"
#include "meshtrain/model/model.h"
#include "meshtrain/parallel/group_layout.h"
#include "meshtrain/parallel/parallel_dims.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain {

struct StepGraph {
  Graph graph;
  std::unique_ptr<Model> model;
  std::unique_ptr<ParallelPlan> plan;
  ValueId tokens = kNoValue, labels = kNoValue, token_count = kNoValue;
  ValueId loss = kNoValue;      // this micro-batch's loss (already divided by the global count)
  ValueId loss_sum = kNoValue;  // persistent [1] accumulator of `loss` over a step's micro-batches
  ReshardStats reshard;
  CheckpointStats checkpoint;
  std::map<MeshGroup, int> streams;  // mesh group -> stream index
  int64_t local_batch = 0, seq_len = 0;
};

struct StepGraphOptions {
  int64_t tokenizer_vocab = 0;
  DType compute_dtype = DType::kF32;
  DType master_dtype = DType::kF32;
  DType reduce_dtype = DType::kF32;
  // One micro-batch per optimizer step: gradients are written, not accumulated, and the
  // optimizer leaves them as they are (AdamWParams::reset_grad false).
  bool overwrite_grads = false;
};

// [parallelism] degrees as ParallelDims for a world of `world` ranks (not yet validated).
ParallelDims parallel_dims_of(const JobConfig& cfg, int world);

std::unique_ptr<StepGraph> build_step_graph(const JobConfig& cfg, const GroupLayout* layout,
                                            const StepGraphOptions& options);

}  // namespace meshtrain
