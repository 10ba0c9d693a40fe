// Optimizer graph construction and step.
#include "meshtrain/optim/optimizer.h"

#include <cmath>

#include "meshtrain/comm/collective_ops.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/load_balance.h"

namespace meshtrain {

Optimizer::Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
                     ExecServices* services, const LoadBalanceOptions& lb)
    : store_(store), backend_(backend) {
  Builder b(graph_, NodePhase::kOptimizer);
  lr_slot_ = graph_.add_scalar("lr");
  step_slot_ = graph_.add_scalar("step");
  struct Bound {
    ValueId master, grad, m, v;
  };
  std::vector<Bound> bound;
  for (size_t i = 0; i < store.groups().size(); ++i) {
    const ParamGroup& g = store.groups()[i];
    TensorMeta meta{g.master.shape(), g.master.dtype()};
    const std::string tag = g.norm_groups.empty() ? "local" : mesh_group_list(g.norm_groups);
    bound.push_back({b.persistent("group." + tag + ".master", meta, ValueRole::kParameter),
                     b.persistent("group." + tag + ".grad", meta, ValueRole::kGradient),
                     b.persistent("group." + tag + ".exp_avg", meta, ValueRole::kState),
                     b.persistent("group." + tag + ".exp_avg_sq", meta, ValueRole::kState)});
  }
  ValueId total = kNoValue;
  for (size_t i = 0; i < bound.size(); ++i) {
    const ParamGroup& g = store.groups()[i];
    auto s = b.scope("grad_norm." + (g.norm_groups.empty() ? std::string("local")
                                                           : mesh_group_list(g.norm_groups)));
    ValueId sq = ops::sum_squares(b, bound[i].grad);
    // Shards are disjoint over each listed group: summing over them counts every element once.
    for (MeshGroup group : g.norm_groups) sq = ops::all_reduce(b, sq, group);
    total = total == kNoValue ? sq : ops::add(b, total, sq);
  }
  if (total == kNoValue) total = ops::fill(b, Shape{1}, DType::kF64, 0.0);
  norm_sq_ = total;
  graph_.mark_output(norm_sq_);
  // Load balancing runs where torchtitan's optimizer pre-hook does, before the update (the two
  // are independent). The counts summed over `count_group` make the update the global one.
  std::vector<std::pair<ValueId, Tensor>> lb_bound;
  for (const LoadBalanceLayer& l : lb.layers) {
    auto s = b.scope(l.layer + ".load_balance");
    auto state = [&](const std::string& name) {
      Tensor t = store.master(name);
      ValueId v = b.persistent(name, {t.shape(), t.dtype()}, ValueRole::kState);
      lb_bound.emplace_back(v, t);
      return v;
    };
    ValueId bias = state(l.expert_bias), counter = state(l.tokens_per_expert),
            load = state(l.last_load);
    ValueId counts = lb.count_group ? ops::all_reduce(b, counter, *lb.count_group) : kNoValue;
    ops::expert_bias_update(b, bias, counter, load, l.coeff, counts);
  }
  for (size_t i = 0; i < bound.size(); ++i) {
    auto s = b.scope("adamw");
    ops::adamw_update(b, bound[i].master, bound[i].grad, bound[i].m, bound[i].v, total, lr_slot_,
                      step_slot_, params);
  }
  exec_ = std::make_unique<Executor>(graph_, plan_memory(graph_, backend.device().type), backend,
                                     services);
  for (size_t i = 0; i < bound.size(); ++i) {
    const ParamGroup& g = store.groups()[i];
    exec_->bind(bound[i].master, g.master);
    exec_->bind(bound[i].grad, g.grad);
    exec_->bind(bound[i].m, g.exp_avg);
    exec_->bind(bound[i].v, g.exp_avg_sq);
  }
  for (auto& [v, t] : lb_bound) exec_->bind(v, t);
  exec_->prepare();
  host_norm_ = Tensor::empty(Shape{1}, DType::kF64, backend.host_staging_allocator());
}

void Optimizer::step(int64_t step, double lr) {
  exec_->set_scalar(lr_slot_, lr);
  exec_->set_scalar(step_slot_, double(step));
  exec_->run();
}

double Optimizer::last_grad_norm() {
  Stream& s = backend_.stream(0);
  backend_.copy(host_norm_.raw(), exec_->tensor(norm_sq_).raw(), 8, CopyKind::kDeviceToHost, s);
  // Host sync: the norm is read for the log line and metrics, only on logging steps.
  s.synchronize();
  return std::sqrt(host_norm_.data<double>()[0]);
}

}  // namespace meshtrain
