// The training step graph of one micro-batch, built the same way for `train` and `plan`:
// inputs → model forward → loss → autodiff → gradient accumulation sinks → five passes (dead-code
// elimination, slice-gradient fusion, activation checkpointing, FSDP reshard-after-forward,
// stream assignment). Shapes are this rank's local shapes. The optimizer settings and the graph
// dump that both commands share live here too.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/activation_checkpoint.h"
#include "meshtrain/graph/passes/bucket_collectives.h"
#include "meshtrain/graph/passes/reshard_after_forward.h"
#include "meshtrain/model/model.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/group_layout.h"
#include "meshtrain/parallel/parallel_dims.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain {

struct StepGraph {
  Graph graph;
  std::unique_ptr<Model> model;
  std::unique_ptr<ParallelPlan> plan;
  ValueId tokens = kNoValue, labels = kNoValue, token_count = kNoValue;
  ValueId loss = kNoValue;  // this micro-batch's loss (already divided by the global count)
  // Persistent accumulator over a step's micro-batches: [1] `loss`, or with MTP [2 + D]: the
  // total, the main loss, then each depth's (train/loss_parts.h reads it).
  ValueId loss_sum = kNoValue;
  // Multi-token prediction (model/mtp.h): its modules, and the inputs the runner writes
  // (train/loss_parts.h): each depth's global target count [D] int64 and the loss weight [1].
  int mtp_layers = 0;
  ValueId mtp_token_count = kNoValue, mtp_loss_weight = kNoValue;
  ReshardStats reshard;
  CheckpointStats checkpoint;
  BucketStats buckets;
  PrefetchStats prefetch;
  int fused_grad_matmuls = 0;  // weight-gradient GEMMs writing fp32 gradients (fuse_grad_matmul)
  std::map<MeshGroup, int> streams;  // mesh group -> stream index
  int64_t local_batch = 0, seq_len = 0;
};

struct StepGraphOptions {
  int64_t tokenizer_vocab = 0;
  std::string vocab_source;  // the tokenizer or token file that sets tokenizer_vocab
  DType compute_dtype = DType::kF32;
  DType master_dtype = DType::kF32;
  DType reduce_dtype = DType::kF32;
  // One micro-batch per optimizer step: gradients are written, not accumulated, and the
  // optimizer leaves them as they are (AdamWParams::reset_grad false).
  bool overwrite_grads = false;
  // Builds the model instead of [model] (tests that train a model from explicit arguments); empty:
  // the model is [model]'s flavor.
  std::function<std::unique_ptr<Model>()> make_model;
};

// [parallelism] degrees as ParallelDims for a world of `world` ranks (not yet validated).
ParallelDims parallel_dims_of(const JobConfig& cfg, int world);

std::unique_ptr<StepGraph> build_step_graph(const JobConfig& cfg, const GroupLayout* layout,
                                            const StepGraphOptions& options);

// The same model's forward and loss only (no backward, no gradients, no recompute passes), on
// micro-batches of `local_batch` x `seq_len`: the validation graph. Its parameters have the
// training graph's names and shapes, so an executor can bind it to the same master tensors.
std::unique_ptr<StepGraph> build_forward_graph(const JobConfig& cfg, const GroupLayout* layout,
                                               const StepGraphOptions& options, int64_t local_batch,
                                               int64_t seq_len);
// [compile] as the bucketing pass's options.
BucketOptions bucket_options(const CompileSection& compile);
// The AdamW settings of a job that accumulates over `accum_steps` micro-batches.
ops::AdamWParams adamw_params(const JobConfig& cfg, int64_t accum_steps);
// Load balancing of the plan's MoE layers: the expert counts are summed over the ranks that
// routed different tokens (see the definition).
LoadBalanceOptions load_balance_options(const ParallelPlan& plan, const GroupLayout& layout);

// The scheduled step graph (run `accum_steps` times per optimizer step) and the optimizer graph,
// as text (graph/graph_dump.h).
std::string dump_step_graphs(const Graph& step, const MemoryPlan& step_plan, int64_t accum_steps,
                             const Graph& optimizer, const MemoryPlan& optimizer_plan);

}  // namespace meshtrain
