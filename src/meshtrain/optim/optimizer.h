// The optimizer step as a small static graph run by the same executor as the training step:
// per norm group Σg² (all-reduced over the group whose ranks hold disjoint shards, so every
// element counts once), the global norm, then one fused clip+AdamW pass per flat group (which
// also writes the group's compute copies under mixed precision). MoE
// layers' expert_bias updates (auxiliary-loss-free load balancing) run in the same graph.
//
// Overlap with the next step ([optimizer] overlap_next_step): the update runs on a stream of its
// own, one AdamW slice per layer (the parameters' order: embedding, layers, output), and records
// an event after each slice; the next step's graph waits, on each of its streams, only at its
// first node that touches a slice's bytes (Executor::wait_for_external_writes). So its forward
// starts as soon as the embedding is updated and runs beside the rest of the update. The host reads
// the norm after the norm's nodes only, and whatever else reads the weights or the optimizer state
// between steps (validation, checkpoints, the load counts) first joins the update (join, or
// join_state for the load counts). The update's own collectives (the norm's and the load counts'
// all-reduces) come first in its schedule, and the host waits for them before it enqueues the
// next step's on the same communicators. Every element's arithmetic is the same: a bitwise equal
// run.
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
  std::vector<GroupValues> groups;  // per ParamGroup
  // One AdamW pass: elements [begin, begin + count) of group `group`'s flat buffers, the
  // parameters of one layer (`name`: its first parameter's layer) or the whole group.
  struct Slice {
    size_t group = 0;
    int64_t begin = 0, count = 0;
    std::string name;
    NodeId node = -1;
  };
  std::vector<Slice> slices;
  std::vector<std::pair<ValueId, std::string>> state;  // load-balancing buffers, by param name
  std::vector<NodeId> state_nodes;                     // the nodes that update them
  int lr_slot = -1, step_slot = -1;
  ValueId norm_sq = kNoValue;  // Σg² over every group (a graph output)
};
// `groups` as layout_param_groups(plan) gives them. by_layer: one AdamW slice per layer of each
// group (overlap_next_step), else one per group.
void build_optimizer_graph(OptimizerGraph& out, const std::vector<ParamGroup>& groups,
                           const ParallelPlan& plan, const ops::AdamWParams& params,
                           const LoadBalanceOptions& load_balance, bool by_layer = false);

// The layer a parameter belongs to for the update's slices: "layers.3" of "layers.3.moe.w1",
// "tok_embeddings" of "tok_embeddings.weight".
std::string param_layer(const std::string& name);

// The backend stream the update runs on under overlap_next_step: above every stream the passes
// assign, so it never queues behind the next step's communication.
inline constexpr int kOptimizerStream = 15;

class Optimizer {
 public:
  Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
            ExecServices* services, const LoadBalanceOptions& load_balance = {},
            bool overlap_next_step = false);
  ~Optimizer();
  // Enqueues optimizer step `step` (1-based) with learning rate `lr`, after the work enqueued on
  // stream 0 so far; gradients are zero after (unless AdamWParams::reset_grad is false: the next
  // step overwrites them).
  void step(int64_t step, double lr);
  // Global gradient norm (before clipping) of the last step; waits for the norm only.
  double last_grad_norm();
  // Stream s waits (on the device) for the whole last update, or for its load-balancing state.
  void join(Stream& s);
  void join_state(Stream& s);
  // What the update writes, slice by slice, with the events recorded after each: the next step's
  // executor waits on them (empty unless overlap_next_step).
  std::vector<ExternalWrite> writes() const;
  bool overlaps() const { return overlap_; }
  int num_slices() const { return int(og_.slices.size()); }
  const Graph& graph() const { return og_.graph; }
  const MemoryPlan& plan() const { return exec_->plan(); }

 private:
  ParamStore& store_;
  Backend& backend_;
  OptimizerGraph og_;
  bool overlap_ = false;
  int stream_ = 0;  // the backend stream the update runs on
  std::unique_ptr<Executor> exec_;
  Tensor host_norm_;
  std::unique_ptr<Event> grads_ready_, norm_ready_, state_ready_, done_;
  std::unique_ptr<Event> collectives_done_;  // overlap_next_step with collectives in the update
  std::vector<std::unique_ptr<Event>> slice_done_;  // by og_.slices
};

}  // namespace meshtrain
