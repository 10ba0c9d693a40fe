// The optimizer step as a small static graph run by the same executor as the training step:
// per norm group Σg² (all-reduced over the group whose ranks hold disjoint shards, so every
// element counts once), the global norm, then one fused clip+AdamW pass per flat group (which
// also writes the group's compute copies under mixed precision). MoE
// layers' expert_bias updates (auxiliary-loss-free load balancing) run in the same graph.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/graph/executor.h"
#include "meshtrain/ops/optimizer_ops.h"
#include "meshtrain/optim/param_store.h"

namespace meshtrain {

struct LoadBalanceOptions {
  std::vector<LoadBalanceLayer> layers;  // from ParallelPlan::load_balance_layers()
  // Mesh group whose ranks routed different tokens: their counts are summed before the update
  // so every rank moves its bias identically (unset: one rank's counts are the global counts).
  std::optional<MeshGroup> count_group;
};

// The optimizer graph and the persistent values its owner binds; built without memory, so
// `meshtrain plan --dump-graph` shows the same graph the trainer runs.
struct OptimizerGraph {
  struct GroupValues {
    ValueId master = kNoValue, grad = kNoValue, exp_avg = kNoValue, exp_avg_sq = kNoValue;
    ValueId compute = kNoValue;  // the group's compute copies (ParamGroup::has_compute)
  };
  Graph graph;
  std::vector<GroupValues> groups;                     // per ParamGroup
  std::vector<std::pair<ValueId, std::string>> state;  // load-balancing buffers, by param name
  int lr_slot = -1, step_slot = -1;
  ValueId norm_sq = kNoValue;  // Σg² over every group (a graph output)
};
// `groups` as layout_param_groups(plan) gives them.
void build_optimizer_graph(OptimizerGraph& out, const std::vector<ParamGroup>& groups,
                           const ParallelPlan& plan, const ops::AdamWParams& params,
                           const LoadBalanceOptions& load_balance);

class Optimizer {
 public:
  Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
            ExecServices* services, const LoadBalanceOptions& load_balance = {});
  // Enqueues optimizer step `step` (1-based) with learning rate `lr`; gradients are zero after
  // (unless AdamWParams::reset_grad is false: the next step overwrites them).
  void step(int64_t step, double lr);
  // Global gradient norm (before clipping) of the last step; reads it back (a host sync).
  double last_grad_norm();
  const Graph& graph() const { return og_.graph; }
  const MemoryPlan& plan() const { return exec_->plan(); }

 private:
  ParamStore& store_;
  Backend& backend_;
  OptimizerGraph og_;
  std::unique_ptr<Executor> exec_;
  Tensor host_norm_;
};

}  // namespace meshtrain
