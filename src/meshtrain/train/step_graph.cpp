// build_step_graph: the one place the step graph is assembled.
#include "meshtrain/train/step_graph.h"

#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/graph_dump.h"
#include "meshtrain/graph/passes/assign_streams.h"
#include "meshtrain/graph/passes/fuse_grad_matmul.h"
#include "meshtrain/graph/passes/fuse_slice_grads.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain {

ParallelDims parallel_dims_of(const JobConfig& cfg, int world) {
  const ParallelismSection& p = cfg.parallelism;
  ParallelDims d;
  d.dp_replicate = p.data_parallel_replicate_degree;
  d.dp_shard = p.data_parallel_shard_degree;
  d.cp = p.context_parallel_degree;
  d.tp = p.tensor_parallel_degree;
  d.ep = p.expert_parallel_degree;
  d.etp = p.expert_tensor_parallel_degree;
  d.world = world;
  return d;
}

namespace {

// [model] mtp_layers against the model built: a model read from [model] hf_config must have
// taken it too (a mismatch would train without the modules the user asked for, silently).
void check_mtp_layers(const ModelSection& m, const Model& model) {
  MT_CHECK_T(ConfigError, model.mtp_layers() == m.mtp_layers,
             "[model] mtp_layers = {} but the {} model built from {} has {} MTP modules",
             m.mtp_layers, model.name(),
             m.hf_config.empty() ? std::string("its flavor") : "[model] hf_config " + m.hf_config,
             model.mtp_layers());
}

// The dtype of the cross-entropy losses: float32 for bfloat16 logits, else the compute dtype.
DType loss_dtype(DType compute) { return compute == DType::kBF16 ? DType::kF32 : compute; }

// Model, plan, inputs and the forward up to the loss accumulator: what the training and the
// validation graphs share. `local_batch` x `seq_len` is one micro-batch of this rank.
std::unique_ptr<StepGraph> build_forward(const JobConfig& cfg, const GroupLayout* layout,
                                         const StepGraphOptions& o, int64_t local_batch,
                                         int64_t seq_len, bool training) {
  auto sg = std::make_unique<StepGraph>();
  ModelOptions mo;
  mo.name = cfg.model.name;
  mo.flavor = cfg.model.flavor;
  mo.tokenizer_vocab = o.tokenizer_vocab;
  mo.vocab_source = o.vocab_source;
  mo.vocab_override = cfg.model.vocab_size;
  mo.n_layers_override = int(cfg.model.n_layers);
  mo.seq_len = seq_len;
  mo.load_balance_coeff = cfg.model.load_balance_coeff;
  mo.moe_top_k = cfg.model.moe_top_k;
  mo.router_zero_init = cfg.model.router_zero_init;
  mo.attention_kernel = cfg.model.attention_backend;
  mo.expert_gemm_kernel = cfg.model.expert_gemm_backend;
  mo.mtp_layers = int(cfg.model.mtp_layers);
  if (o.make_model)
    sg->model = o.make_model();
  else if (cfg.model.hf_config.empty())
    sg->model = create_model(mo);
  else
    sg->model = create_model_from_hf(read_hf_config(cfg.model.hf_config), mo);
  check_mtp_layers(cfg.model, *sg->model);
  sg->plan = std::make_unique<ParallelPlan>(
      PlanConfig{
          .master_dtype = o.master_dtype,
          .compute_dtype = o.compute_dtype,
          .reduce_dtype = o.reduce_dtype,
          .compute_copies = cfg.training.compute_weight_copies,
          .expert_capacity_factor = cfg.parallelism.expert_capacity_factor,
          .expert_exchange_padded = cfg.parallelism.expert_exchange == ExpertExchange::kPadded},
      layout);
  sg->local_batch = local_batch;
  sg->seq_len = seq_len;

  Graph& g = sg->graph;
  Builder b(g);
  const Shape bs{sg->local_batch, sg->seq_len};
  sg->tokens = b.input("tokens", {bs, DType::kI32});
  sg->labels = b.input("labels", {bs, DType::kI32});
  sg->token_count = b.input("token_count", {Shape{1}, DType::kI64});
  ModelInputs in{sg->tokens, sg->labels, sg->token_count, sg->local_batch, sg->seq_len};
  in.fused_output_loss = cfg.model.fused_output_loss;
  in.output_loss_chunk_rows = cfg.model.output_loss_chunk_rows;
  in.loss_grads = training;
  sg->mtp_layers = sg->model->mtp_layers();
  if (sg->mtp_layers > 0) {
    sg->mtp_token_count = b.input("mtp_token_count", {Shape{sg->mtp_layers}, DType::kI64});
    sg->mtp_loss_weight = b.input("mtp_loss_weight", {Shape{1}, loss_dtype(o.compute_dtype)});
    in.mtp_token_count = sg->mtp_token_count;
    in.mtp_loss_weight = sg->mtp_loss_weight;
  }
  const ModelLoss loss = sg->model->build_loss(b, *sg->plan, in);
  sg->loss = loss.total;
  // Without MTP the accumulator holds the loss alone; with it [total, main, mtp_1 .. mtp_D].
  ValueId parts = loss.total;
  if (sg->mtp_layers > 0) {
    std::vector<ValueId> all{loss.total, loss.main};
    all.insert(all.end(), loss.mtp.begin(), loss.mtp.end());
    parts = ops::concat(b, all, 0);
  }
  sg->loss_sum = b.persistent("loss_sum", b.meta(parts), ValueRole::kState);
  ops::accumulate(b, sg->loss_sum, parts);
  return sg;
}

}  // namespace

std::unique_ptr<StepGraph> build_forward_graph(const JobConfig& cfg, const GroupLayout* layout,
                                               const StepGraphOptions& o, int64_t local_batch,
                                               int64_t seq_len) {
  std::unique_ptr<StepGraph> sg =
      build_forward(cfg, layout, o, local_batch, seq_len, /*training=*/false);
  eliminate_dead_nodes(sg->graph);
  sg->streams = assign_streams(sg->graph);
  return sg;
}

std::unique_ptr<StepGraph> build_step_graph(const JobConfig& cfg, const GroupLayout* layout,
                                            const StepGraphOptions& o) {
  std::unique_ptr<StepGraph> sg =
      build_forward(cfg, layout, o, cfg.training.local_batch_size, cfg.training.seq_len,
                    /*training=*/true);
  Graph& g = sg->graph;
  GradientMap grads = differentiate(g, sg->loss, sg->plan->trainable_weights());
  Builder bb(g, NodePhase::kBackward);
  sg->plan->attach_gradients(bb, grads, o.overwrite_grads);
  eliminate_dead_nodes(g);
  fuse_slice_grads(g);
  sg->fused_grad_matmuls = fuse_grad_matmul(g);

  // Activation checkpointing first: the reshard pass then also re-gathers the weights that
  // recomputed blocks read.
  const auto& ac = cfg.activation_checkpoint;
  if (ac.mode == AcMode::kFull) {
    sg->checkpoint = checkpoint_regions(g, block_regions(1), full_recompute_saves);
  } else if (ac.mode == AcMode::kSelective) {
    const SelectiveAcKind kind = ac.selective_ac_option.kind;
    if (kind == SelectiveAcKind::kOp)
      sg->checkpoint = checkpoint_regions(g, block_regions(1), selective_op_saves);
    else if (kind == SelectiveAcKind::kFree)
      sg->checkpoint = checkpoint_regions(g, block_regions(1), free_recompute_saves(g));
    else
      sg->checkpoint =
          checkpoint_regions(g, block_regions(ac.selective_layer_interval()), full_recompute_saves);
  }

  const auto policy = cfg.parallelism.fsdp_reshard_after_forward;
  // Blocks in forward order: the main stack's, then the MTP modules' (the last one's backward
  // comes first).
  const int n_blocks = sg->model->num_blocks();
  if (policy != ReshardAfterForward::kNever && layout && layout->group_size(MeshGroup::kFsdp) > 1) {
    // torchtitan's "default": every transformer block but the last reshards (backward starts
    // with the last block right away); the root parameters stay gathered.
    sg->reshard = reshard_after_forward(g, MeshGroup::kFsdp, [&](const Node& gather) {
      if (policy == ReshardAfterForward::kAlways) return true;
      return gather.block != kNoBlock && gather.block != n_blocks - 1;
    });
  }
  // Then the scheduling passes: buckets over the gathers the passes above left (re-gathers
  // included), then the prefetch order.
  sg->buckets = bucket_collectives(g, bucket_options(cfg.compile));
  if (cfg.compile.graph_passes != BucketMode::kNone)
    sg->prefetch = prefetch_gathers(g, int(cfg.compile.max_gathered_blocks));
  // Last: collectives onto one stream per mesh group (the CPU backend runs streams in order).
  sg->streams = assign_streams(g);
  return sg;
}

BucketOptions bucket_options(const CompileSection& c) {
  BucketOptions o;
  o.mode = c.graph_passes;
  o.bucket_bytes = c.bucket_cap_mb << 20;
  return o;
}

ops::AdamWParams adamw_params(const JobConfig& cfg, int64_t accum_steps) {
  return ops::AdamWParams{.beta1 = cfg.optimizer.beta1,
                          .beta2 = cfg.optimizer.beta2,
                          .eps = cfg.optimizer.eps,
                          .weight_decay = cfg.optimizer.weight_decay,
                          .max_norm = cfg.training.max_norm,
                          .reset_grad = accum_steps > 1};
}

LoadBalanceOptions load_balance_options(const ParallelPlan& plan, const GroupLayout& layout) {
  // Tokens differ across the data-parallel and context-parallel ranks (the "loss" group): the
  // expert counts are summed over it before the bias update, as torchtitan does.
  // With ETP = 1 and tp > 1 routing runs on sequence-parallel token shards, so tp ranks saw other
  // tokens too and the sum runs over every rank; with ETP = tp the tp ranks routed the same
  // (gathered) tokens and only the data-parallel ranks differ.
  const bool shard_routing =
      layout.group_size(MeshGroup::kTp) > 1 && layout.group_size(MeshGroup::kEtp) == 1;
  const MeshGroup count_group = shard_routing ? MeshGroup::kWorld : MeshGroup::kLoss;
  LoadBalanceOptions lb{.layers = plan.load_balance_layers()};
  if (layout.group_size(count_group) > 1) lb.count_group = count_group;
  return lb;
}

std::string dump_step_graphs(const Graph& step, const MemoryPlan& step_plan, int64_t accum_steps,
                             const Graph& optimizer, const MemoryPlan& optimizer_plan) {
  return dump_graphs(
      {{fmt::format("step graph (one micro-batch, run {}x per optimizer step)", accum_steps), &step,
        &step_plan},
       {"optimizer graph (once per optimizer step)", &optimizer, &optimizer_plan}});
}

}  // namespace meshtrain
