// Optimizer graph construction and step.
#include "meshtrain/optim/optimizer.h"

#include <cmath>

#include "meshtrain/moe/load_balance.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {

void build_optimizer_graph(OptimizerGraph& og, const std::vector<ParamGroup>& groups,
                           const ParallelPlan& plan, const ops::AdamWParams& params,
                           const LoadBalanceOptions& lb) {
  Graph& graph = og.graph;
  Builder b(graph, NodePhase::kOptimizer);
  og.lr_slot = graph.add_scalar("lr");
  og.step_slot = graph.add_scalar("step");
  const DType dtype = plan.config().master_dtype;
  auto tag = [](const ParamGroup& g) {
    return g.norm_groups.empty() ? std::string("local") : mesh_group_list(g.norm_groups);
  };
  for (const ParamGroup& g : groups) {
    // The flat buffers ParamStore allocates: at least one element.
    TensorMeta meta{Shape{std::max<int64_t>(g.numel, 1)}, dtype};
    const std::string t = tag(g);
    og.groups.push_back({b.persistent("group." + t + ".master", meta, ValueRole::kParameter),
                         b.persistent("group." + t + ".grad", meta, ValueRole::kGradient),
                         b.persistent("group." + t + ".exp_avg", meta, ValueRole::kState),
                         b.persistent("group." + t + ".exp_avg_sq", meta, ValueRole::kState)});
    if (g.has_compute)
      og.groups.back().compute = b.persistent(
          "group." + t + ".compute", {meta.shape, g.compute_dtype}, ValueRole::kComputeCopy);
  }
  ValueId total = kNoValue;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    auto s = b.scope("grad_norm." + tag(g));
    ValueId sq = ops::sum_squares(b, og.groups[i].grad);
    // Shards are disjoint over each listed group: summing over them counts every element once.
    for (MeshGroup group : g.norm_groups) sq = ops::all_reduce(b, sq, group);
    total = total == kNoValue ? sq : ops::add(b, total, sq);
  }
  if (total == kNoValue) total = ops::fill(b, Shape{1}, DType::kF64, 0.0);
  og.norm_sq = total;
  graph.mark_output(og.norm_sq);
  // Load balancing runs where torchtitan's optimizer pre-hook does, before the update (the two
  // are independent). The counts summed over `count_group` make the update the global one.
  for (const LoadBalanceLayer& l : lb.layers) {
    auto s = b.scope(l.layer + ".load_balance", l.block);
    auto state = [&](const std::string& name) {
      const ParamInfo& p = plan.info(name);
      ValueId v = b.persistent(name, {p.local_shape, p.dtype}, ValueRole::kState);
      og.state.emplace_back(v, name);
      return v;
    };
    ValueId bias = state(l.expert_bias), counter = state(l.tokens_per_expert),
            load = state(l.last_load);
    ValueId counts = lb.count_group ? ops::all_reduce(b, counter, *lb.count_group) : kNoValue;
    ops::expert_bias_update(b, bias, counter, load, l.coeff, counts);
  }
  for (const OptimizerGraph::GroupValues& v : og.groups) {
    auto s = b.scope("adamw");
    ops::adamw_update(b, v.master, v.grad, v.exp_avg, v.exp_avg_sq, total, og.lr_slot, og.step_slot,
                      params, v.compute);
  }
}

Optimizer::Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
                     ExecServices* services, const LoadBalanceOptions& lb)
    : store_(store), backend_(backend) {
  build_optimizer_graph(og_, store.groups(), store.plan(), params, lb);
  exec_ = std::make_unique<Executor>(og_.graph, plan_memory(og_.graph, backend.device().type),
                                     backend, services);
  for (size_t i = 0; i < og_.groups.size(); ++i) {
    const ParamGroup& g = store.groups()[i];
    exec_->bind(og_.groups[i].master, g.master);
    exec_->bind(og_.groups[i].grad, g.grad);
    exec_->bind(og_.groups[i].exp_avg, g.exp_avg);
    exec_->bind(og_.groups[i].exp_avg_sq, g.exp_avg_sq);
    if (og_.groups[i].compute != kNoValue) exec_->bind(og_.groups[i].compute, g.compute);
  }
  for (const auto& [v, name] : og_.state) exec_->bind(v, store.master(name));
  exec_->prepare();
  host_norm_ = Tensor::empty(Shape{1}, DType::kF64, backend.host_staging_allocator());
}

void Optimizer::step(int64_t step, double lr) {
  exec_->set_scalar(og_.lr_slot, lr);
  exec_->set_scalar(og_.step_slot, double(step));
  exec_->run();
}

double Optimizer::last_grad_norm() {
  Stream& s = backend_.stream(0);
  backend_.copy(host_norm_.raw(), exec_->tensor(og_.norm_sq).raw(), 8, CopyKind::kDeviceToHost, s);
  // Host sync: the trainer reads the norm every step for its non-finite check (the same stream
  // was just synchronised for the loss, so this wait is short), and for the log line.
  s.synchronize();
  return std::sqrt(host_norm_.data<double>()[0]);
}

}  // namespace meshtrain
