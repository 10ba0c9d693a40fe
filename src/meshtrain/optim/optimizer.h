// The optimizer step as a small static graph run by the same executor as the training step:
// per norm group Σg² (all-reduced over the group whose ranks hold disjoint shards, so every
// element counts once), the global norm, then one fused clip+AdamW pass per flat group. MoE
// layers' expert_bias updates (auxiliary-loss-free load balancing) run in the same graph.
#pragma once

#include <memory>
#include <optional>

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

class Optimizer {
 public:
  Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
            ExecServices* services, const LoadBalanceOptions& load_balance = {});
  // Enqueues optimizer step `step` (1-based) with learning rate `lr`; gradients are zero after
  // (unless AdamWParams::reset_grad is false: the next step overwrites them).
  void step(int64_t step, double lr);
  // Global gradient norm (before clipping) of the last step; reads it back (a host sync).
  double last_grad_norm();
  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return exec_->plan(); }

 private:
  ParamStore& store_;
  Backend& backend_;
  Graph graph_;
  std::unique_ptr<Executor> exec_;
  int lr_slot_ = -1, step_slot_ = -1;
  ValueId norm_sq_ = kNoValue;
  Tensor host_norm_;
};

}  // namespace meshtrain
