// ParallelPlan: SimpleFSDP as placements. A dense parameter is Shard(0) on the `fsdp` view
// (dp_shard × cp), padded to equal shards, and Replicate on `dp_replicate`. What the model gets:
//   master ─replicate_grad(dp_replicate)─► cast(param dtype) ─all_gather(fsdp)─►
//   grad_cast(reduce dtype) ─slice(unpad)─► use
// so autodiff produces: pad → cast(reduce) → reduce_scatter(fsdp) → all_reduce(dp_replicate).
#include "meshtrain/parallel/plan.h"

#include "meshtrain/comm/collective_ops.h"
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
  const int n = group_size("fsdp");
  const int64_t d0 = global_shape[0];
  const int64_t rows = (d0 + n - 1) / n;
  if (n > 1) {
    p.local_shape = global_shape.with(0, rows);
    p.piece = LocalPiece{0, rows * group_rank("fsdp")};
    p.shard_degree = n;
    p.shard_group = "fsdp";
  }
  p.master = b.persistent(name, {p.local_shape, p.dtype},
                          p.trainable ? ValueRole::kParameter : ValueRole::kState);
  ValueId x = p.master;
  if (group_size("dp_replicate") > 1) x = ops::replicate_grad(b, x, "dp_replicate");
  x = ops::cast(b, x, options.compute_dtype.value_or(config_.compute_dtype));
  x = ops::all_gather(b, x, "fsdp", n);
  // Gradients flowing back into the master are reduced in reduce_dtype.
  x = ops::grad_cast(b, x, config_.reduce_dtype);
  if (rows * n != d0) x = ops::slice(b, x, 0, 0, d0);
  return x;
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

const ParamInfo& ParallelPlan::info(const std::string& name) const {
  auto it = index_.find(name);
  MT_CHECK(it != index_.end(), "unknown parameter {}", name);
  return params_[it->second];
}

}  // namespace meshtrain
