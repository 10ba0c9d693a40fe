// ParallelPlan: SimpleFSDP as placements. A dense parameter is Shard(0) on the `fsdp` view
// (dp_shard × cp), padded to equal shards, and Replicate on `dp_replicate`. What the model gets:
//   master ─replicate_grad(dp_replicate)─► cast(param dtype) ─redistribute(Shard(0)→Replicate
//   over fsdp) = all_gather─► grad_cast(reduce dtype) ─slice(unpad)─► use
// so autodiff produces: pad → cast(reduce) → reduce_scatter(fsdp) → all_reduce(dp_replicate).
// Under mixed precision the chain starts at the persistent compute copy instead, and the cast
// becomes grad_cast(master dtype), which leaves the backward exactly as the cast's:
//   copy ─replicate_grad─► grad_cast(master dtype) ─all_gather─► grad_cast(reduce dtype) ─► use
#include "meshtrain/parallel/plan.h"

#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/parallel/group_layout.h"
#include "meshtrain/parallel/placement.h"

namespace meshtrain {

ParallelPlan::ParallelPlan(PlanConfig config, const GroupLayout* layout)
    : config_(config), layout_(layout) {}

int ParallelPlan::group_size(MeshGroup group) const {
  return layout_ ? layout_->group_size(group) : 1;
}
int ParallelPlan::group_rank(MeshGroup group) const {
  return layout_ ? layout_->group_rank(group) : 0;
}
int ParallelPlan::tp_degree() const { return group_size(MeshGroup::kTp); }

ParamInfo& ParallelPlan::declare(const std::string& name, const Shape& global_shape,
                                 const InitSpec& init, ParamOptions options) {
  MT_CHECK(index_.count(name) == 0, "parameter {} declared twice", name);
  ParamInfo p;
  p.name = name;
  p.global_shape = global_shape;
  p.local_shape = global_shape;
  p.init = init;
  p.kind = options.kind;
  p.trainable = options.trainable;
  index_[name] = params_.size();
  params_.push_back(std::move(p));
  return params_.back();
}

ValueId ParallelPlan::param(Builder& b, const std::string& name, const Shape& global_shape,
                            const InitSpec& init, ParamOptions options) {
  ParamInfo& p = declare(name, global_shape, init, options);
  p.dtype = config_.master_dtype;
  const bool expert = options.kind == ParamKind::kExpert;
  const int rank = global_shape.rank();
  std::vector<int64_t> begin(size_t(rank), 0);
  std::vector<MeshGroup> shard_groups;

  // 1. Model-parallel slices (even splits, checked): what the model computes with.
  //    Dense [out, in]: tp column (dim 0) or row (dim 1). Experts [E, a, b]: Shard(0) on ep, and
  //    on etp column (dim 1 of w1/w3 [E, hidden, dim]) or row (dim 2 of w2 [E, dim, hidden]).
  Shape mp_local = global_shape;
  auto split = [&](MeshGroup group, int d, const char* what) {
    const int k = group_size(group);
    if (k == 1) return;
    MT_CHECK_T(ConfigError, d < rank && global_shape[d] % k == 0,
               "{} {}: dim {} ({}) must divide by the {} degree {}", name, global_shape, d, what,
               group, k);
    mp_local = mp_local.with(d, global_shape[d] / k);
    begin[size_t(d)] = mp_local[d] * group_rank(group);
    p.placements.emplace_back(group, Placement::shard(d));
    shard_groups.push_back(group);
  };
  const MeshGroup tp_group = expert ? MeshGroup::kEtp : MeshGroup::kTp;
  const int tp_dim_col = expert ? 1 : 0, tp_dim_row = expert ? 2 : 1;
  if (expert) {
    MT_CHECK_T(ConfigError, rank == 3, "expert weight {} must be [experts, a, b], found {}", name,
               global_shape);
    MT_CHECK_T(ConfigError, global_shape[0] % group_size(MeshGroup::kEp) == 0,
               "{}: num_experts {} must divide by expert_parallel_degree {}", name, global_shape[0],
               group_size(MeshGroup::kEp));
    split(MeshGroup::kEp, 0, "experts");
  } else {
    MT_CHECK_T(ConfigError, options.tp == TpStyle::kReplicate || rank == 2,
               "{} {}: only matrices can be tensor-parallel", name, global_shape);
  }
  if (options.tp == TpStyle::kColwise) split(tp_group, tp_dim_col, "column-parallel");
  if (options.tp == TpStyle::kRowwise) split(tp_group, tp_dim_row, "row-parallel");

  // 2. The data-parallel shard of that slice, padded to equal pieces: dense on fsdp along dim 0;
  //    experts on efsdp along dim 0 when the local experts divide, otherwise along dim 1.
  const MeshGroup dp_group = expert ? MeshGroup::kEfsdp : MeshGroup::kFsdp;
  const int n = group_size(dp_group);
  const int fd = (expert && mp_local[0] % n != 0) ? 1 : 0;
  const int64_t extent = mp_local[fd];
  const int64_t piece_rows = (extent + n - 1) / n;
  std::vector<int64_t> limit(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) limit[size_t(d)] = begin[size_t(d)] + mp_local[d];
  p.local_shape = mp_local;
  if (n > 1) {
    p.local_shape = mp_local.with(fd, piece_rows);
    begin[size_t(fd)] += piece_rows * group_rank(dp_group);
    p.placements.emplace_back(dp_group, Placement::shard(fd));
    shard_groups.insert(shard_groups.begin(), dp_group);
  }
  p.shard_degree = 1;
  for (MeshGroup g : shard_groups) p.shard_degree *= group_size(g);
  p.shard_groups = std::move(shard_groups);
  p.piece = LocalPiece{begin, limit};  // past the model-parallel slice: padding
  const int replicas = group_size(MeshGroup::kDpReplicate);
  if (replicas > 1) p.placements.emplace_back(MeshGroup::kDpReplicate, Placement::replicate());
  const bool tp_replicated =
      !expert && group_size(MeshGroup::kTp) > 1 && options.tp == TpStyle::kReplicate;
  if (tp_replicated) p.placements.emplace_back(MeshGroup::kTp, Placement::replicate());

  p.master = b.persistent(name, {p.local_shape, p.dtype},
                          p.trainable ? ValueRole::kParameter : ValueRole::kState);
  // The compute copy lives in the flat per-group buffers of ParamStore, one dtype per group: only
  // parameters computed in the plan's compute dtype have one (the float32 MoE router gate of a
  // float64-master bfloat16 run casts).
  const DType compute_dtype = options.compute_dtype.value_or(config_.compute_dtype);
  if (p.trainable && config_.compute_copies && compute_dtype != p.dtype &&
      compute_dtype == config_.compute_dtype)
    p.compute =
        b.persistent(name + ".compute", {p.local_shape, compute_dtype}, ValueRole::kComputeCopy);
  ValueId x = p.weight();
  // Replicated across dp_replicate (and across tp for tp-replicated dense weights, whose per-rank
  // gradients are partial: token shards, or partial sums from column-parallel consumers): the
  // per-rank gradients are summed in backward.
  if (replicas > 1) x = ops::replicate_grad(b, x, MeshGroup::kDpReplicate);
  if (tp_replicated) x = ops::replicate_grad(b, x, MeshGroup::kTp);
  // The cast's backward turns the gradient back into the master dtype; from a compute copy the
  // forward needs no cast and grad_cast keeps that backward.
  x = p.compute != kNoValue ? ops::grad_cast(b, x, p.dtype) : ops::cast(b, x, compute_dtype);
  x = redistribute(b, x, n > 1 ? Placement::shard(0) : Placement::replicate(),
                   Placement::replicate(), dp_group, n);
  if (n > 1 && fd == 1) {
    // The gather stacked the n pieces along dim 0: [n·E, r, b] -> [E, n·r, b].
    const Shape& ls = p.local_shape;
    x = ops::reshape(b, x, Shape{n, ls[0], ls[1] * ls[2]});
    x = ops::reshape(b, ops::transpose01(b, x), Shape{ls[0], n * ls[1], ls[2]});
  }
  // Gradients flowing back into the master are reduced in reduce_dtype.
  x = ops::grad_cast(b, x, config_.reduce_dtype);
  if (piece_rows * n != extent) x = ops::slice(b, x, fd, 0, extent);
  return x;
}

ValueId ParallelPlan::shard_tokens(Builder& b, ValueId x) const {
  const int tp = group_size(MeshGroup::kTp);
  if (tp == 1) return x;
  const int64_t t = b.shape(x)[0];
  MT_CHECK_T(ConfigError, t % tp == 0,
             "sequence parallel splits the {} tokens of a micro-batch (local_batch_size × seq_len) "
             "over tensor_parallel_degree {}: they must divide",
             t, tp);
  return ops::slice(b, x, 0, (t / tp) * group_rank(MeshGroup::kTp), t / tp);
}

ValueId ParallelPlan::tp_enter(Builder& b, ValueId x) const {
  return redistribute(b, x, Placement::shard(0), Placement::replicate(), MeshGroup::kTp,
                      group_size(MeshGroup::kTp));
}

ExpertRows ParallelPlan::to_local_experts(Builder& b, ValueId x_perm, ValueId groups,
                                          int64_t capacity, int64_t alignment) const {
  ops::EpLayout l =
      ops::ep_counts(b, groups, MeshGroup::kEp, group_size(MeshGroup::kEp), alignment, capacity,
                     config_.expert_capacity_factor, config_.expert_exchange_padded);
  return ExpertRows{ops::ep_to_experts(b, x_perm, groups, l, MeshGroup::kEp), l.local_groups,
                    l.recv_counts, l.block_rows};
}

ValueId ParallelPlan::from_local_experts(Builder& b, ValueId y_local, const ExpertRows& local,
                                         ValueId groups, int64_t capacity) const {
  ops::EpLayout l{local.recv_counts, local.groups, b.shape(y_local)[0], local.block_rows};
  return ops::ep_from_experts(b, y_local, groups, l, capacity, MeshGroup::kEp);
}

ValueId ParallelPlan::tp_exit(Builder& b, ValueId y) const {
  return redistribute(b, y, Placement::partial(), Placement::shard(0), MeshGroup::kTp,
                      group_size(MeshGroup::kTp));
}

ValueId ParallelPlan::buffer(Builder& b, const std::string& name, const Shape& shape, DType dtype,
                             const InitSpec& init) {
  ParamInfo& p = declare(name, shape, init, ParamOptions{.trainable = false});
  p.dtype = dtype;
  p.master = b.persistent(name, {shape, dtype}, ValueRole::kState);
  return p.master;
}

void ParallelPlan::add_load_balance_layer(LoadBalanceLayer l) {
  const ParamInfo& bias = info(l.expert_bias);
  for (const std::string* n : {&l.expert_bias, &l.tokens_per_expert, &l.last_load}) {
    const ParamInfo& p = info(*n);
    MT_CHECK(!p.trainable && p.global_shape == Shape{l.num_experts} && p.dtype == bias.dtype,
             "load balancing of {}: {} must be a {} [{}] buffer, found {} {}{}", l.layer, *n,
             bias.dtype, l.num_experts, p.dtype, p.global_shape,
             p.trainable ? " (a trainable parameter)" : "");
  }
  MT_CHECK(l.coeff >= 0, "load balancing of {}: coeff must be >= 0, found {}", l.layer, l.coeff);
  load_balance_.push_back(std::move(l));
}

std::vector<ValueId> ParallelPlan::trainable_masters() const {
  std::vector<ValueId> out;
  for (const ParamInfo& p : params_)
    if (p.trainable) out.push_back(p.master);
  return out;
}

std::vector<ValueId> ParallelPlan::trainable_weights() const {
  std::vector<ValueId> out;
  for (const ParamInfo& p : params_)
    if (p.trainable) out.push_back(p.weight());
  return out;
}

void ParallelPlan::attach_gradients(Builder& b, const GradientMap& grads, bool overwrite) {
  for (ParamInfo& p : params_) {
    if (!p.trainable) continue;
    // The gradient of what the forward read (the compute copy's is the master's: see param()).
    ValueId g = grads.grad_of(p.weight());
    MT_CHECK_T(ValueError, g != kNoValue,
               "parameter {} does not influence the loss (no gradient); remove it or check the "
               "model code",
               p.name);
    p.grad = b.persistent(p.name + ".grad", {p.local_shape, p.dtype}, ValueRole::kGradient);
    // Under mixed precision the gradient arrives as cast(bf16 gradient -> master dtype), the
    // backward of the compute-dtype cast. accumulate adds the bf16 values themselves (the same
    // floats: widening bf16 is exact), saving a pass over memory; the cast, then unused, goes
    // with the dead nodes.
    const Graph& graph = b.graph();
    const NodeId from = graph.value(g).producer;
    if (from != kNoNode && OpRegistry::instance().op(graph.node(from).op).cast &&
        b.dtype(graph.node(from).inputs.at(0)) == DType::kBF16 &&
        (p.dtype == DType::kF32 || p.dtype == DType::kF64))
      g = graph.node(from).inputs.at(0);
    ops::accumulate(b, p.grad, g, overwrite);
  }
}

std::string ParamInfo::placement_string() const {
  if (placements.empty()) return "whole";
  std::string s;
  for (const auto& [group, pl] : placements)
    s += (s.empty() ? "" : ", ") + std::string(mesh_group_name(group)) + ": " + pl.to_string();
  return s;
}

const ParamInfo& ParallelPlan::info(const std::string& name) const {
  auto it = index_.find(name);
  MT_CHECK(it != index_.end(), "unknown parameter {}", name);
  return params_[it->second];
}

}  // namespace meshtrain
