// ParallelPlan: SimpleFSDP as placements. A dense parameter is Shard(0) on the `fsdp` view
// (dp_shard × cp), padded to equal shards, and Replicate on `dp_replicate`. What the model gets:
//   master ─replicate_grad(dp_replicate)─► cast(param dtype) ─redistribute(Shard(0)→Replicate
//   over fsdp) = all_gather─► grad_cast(reduce dtype) ─slice(unpad)─► use
// so autodiff produces: pad → cast(reduce) → reduce_scatter(fsdp) → all_reduce(dp_replicate).
#include "meshtrain/parallel/plan.h"

#include "meshtrain/comm/collective_ops.h"
#include "meshtrain/parallel/placement.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/parallel/group_layout.h"

namespace meshtrain {

ParallelPlan::ParallelPlan(PlanConfig config, const GroupLayout* layout)
    : config_(config), layout_(layout) {}

int ParallelPlan::group_size(const std::string& group) const {
  return layout_ ? layout_->group_size(group) : 1;
}
int ParallelPlan::group_rank(const std::string& group) const {
  return layout_ ? layout_->group_rank(group) : 0;
}
int ParallelPlan::tp_degree() const { return group_size("tp"); }

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
  const int tp = group_size("tp");
  const int n = group_size("fsdp");
  std::vector<int64_t> begin(size_t(global_shape.rank()), 0);
  std::vector<std::string> shard_groups;
  // 1. The tensor-parallel slice (even split, checked), which the model computes with.
  Shape tp_local = global_shape;
  if (tp > 1 && options.tp != TpStyle::kReplicate) {
    const int d = options.tp == TpStyle::kColwise ? 0 : 1;
    MT_CHECK_T(ConfigError, global_shape.rank() == 2 && global_shape[d] % tp == 0,
               "{} {}: dim {} must divide by tensor_parallel_degree {} for {}-parallel",
               name, global_shape, d, tp, d == 0 ? "column" : "row");
    tp_local = global_shape.with(d, global_shape[d] / tp);
    begin[size_t(d)] = tp_local[d] * group_rank("tp");
    p.placements.emplace_back("tp", Placement::shard(d));
  }
  // 2. The FSDP shard of that slice along dim 0, padded to equal rows.
  const int64_t d0 = tp_local[0];
  const int64_t rows = (d0 + n - 1) / n;
  p.local_shape = tp_local;
  if (n > 1) {
    p.local_shape = tp_local.with(0, rows);
    begin[0] += rows * group_rank("fsdp");
    p.shard_degree = n;
    shard_groups.push_back("fsdp");
    p.placements.emplace_back("fsdp", Placement::shard(0));
  }
  if (!p.placements.empty() && p.placements.front().first == "tp") {
    p.shard_degree *= tp;
    shard_groups.push_back("tp");
  }
  p.shard_group = fmt::format("{}", fmt::join(shard_groups, ","));
  std::vector<int64_t> limit(size_t(global_shape.rank()));
  for (int d = 0; d < global_shape.rank(); ++d) limit[size_t(d)] = global_shape[d];
  limit[0] = (begin[0] - (n > 1 ? rows * group_rank("fsdp") : 0)) + d0;  // end of the tp slice
  p.piece = LocalPiece{begin, limit};
  const int replicas = group_size("dp_replicate");
  if (replicas > 1) p.placements.emplace_back("dp_replicate", Placement::replicate());
  const bool tp_replicated = tp > 1 && options.tp == TpStyle::kReplicate;
  if (tp_replicated) p.placements.emplace_back("tp", Placement::replicate());

  p.master = b.persistent(name, {p.local_shape, p.dtype},
                          p.trainable ? ValueRole::kParameter : ValueRole::kState);
  ValueId x = p.master;
  // Replicated across dp_replicate (and across tp for tp-replicated weights, whose per-rank
  // gradients are partial: token shards, or partial sums from column-parallel consumers): the
  // per-rank gradients are summed in backward.
  if (replicas > 1) x = ops::replicate_grad(b, x, "dp_replicate");
  if (tp_replicated) x = ops::replicate_grad(b, x, "tp");
  x = ops::cast(b, x, options.compute_dtype.value_or(config_.compute_dtype));
  x = redistribute(b, x, n > 1 ? Placement::shard(0) : Placement::replicate(),
                   Placement::replicate(), "fsdp", n);
  // Gradients flowing back into the master are reduced in reduce_dtype.
  x = ops::grad_cast(b, x, config_.reduce_dtype);
  if (rows * n != d0) x = ops::slice(b, x, 0, 0, d0);
  return x;
}

ValueId ParallelPlan::shard_tokens(Builder& b, ValueId x) const {
  const int tp = group_size("tp");
  if (tp == 1) return x;
  const int64_t t = b.shape(x)[0];
  MT_CHECK_T(ConfigError, t % tp == 0,
             "sequence parallel splits the {} tokens of a micro-batch (local_batch_size × seq_len) "
             "over tensor_parallel_degree {}: they must divide",
             t, tp);
  return ops::slice(b, x, 0, (t / tp) * group_rank("tp"), t / tp);
}

ValueId ParallelPlan::tp_enter(Builder& b, ValueId x) const {
  return redistribute(b, x, Placement::shard(0), Placement::replicate(), "tp", group_size("tp"));
}

ValueId ParallelPlan::tp_exit(Builder& b, ValueId y) const {
  return redistribute(b, y, Placement::partial(), Placement::shard(0), "tp", group_size("tp"));
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

void ParallelPlan::attach_gradients(Builder& b, const GradientMap& grads) {
  for (ParamInfo& p : params_) {
    if (!p.trainable) continue;
    ValueId g = grads.grad_of(p.master);
    MT_CHECK_T(ValueError, g != kNoValue,
               "parameter {} does not influence the loss (no gradient); remove it or check the "
               "model code",
               p.name);
    p.grad = b.persistent(p.name + ".grad", {p.local_shape, p.dtype}, ValueRole::kGradient);
    ops::accumulate(b, p.grad, g);
  }
}

std::string ParamInfo::placement_string() const {
  if (placements.empty()) return "whole";
  std::string s;
  for (const auto& [group, pl] : placements) s += (s.empty() ? "" : ", ") + group + ": " + pl.to_string();
  return s;
}

const ParamInfo& ParallelPlan::info(const std::string& name) const {
  auto it = index_.find(name);
  MT_CHECK(it != index_.end(), "unknown parameter {}", name);
  return params_[it->second];
}

}  // namespace meshtrain
