// ParamStore: owns the persistent training state of this rank in flat device buffers, one set
// per norm group (parameters whose shards combine over the same mesh groups): master weights,
// gradient accumulators and the two AdamW moments, laid out identically so the optimizer runs one
// fused pass per group. Non-trainable state (expert_bias, ...) has its own buffers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/graph/executor.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

struct ParamGroup {
  // Groups whose ranks hold disjoint shards, in reduction order (empty: every shard is local).
  std::vector<MeshGroup> norm_groups;
  std::vector<size_t> params;    // indices into plan.params()
  std::vector<int64_t> offsets;  // element offset of each param in the flat buffers
  int64_t numel = 0;
  Tensor master, grad, exp_avg, exp_avg_sq;
};

// The norm groups of a plan's trainable parameters (first-seen order) and each parameter's offset
// in its group's flat buffers, without allocating them (tensors left undefined).
std::vector<ParamGroup> layout_param_groups(const ParallelPlan& plan);

class ParamStore {
 public:
  ParamStore(const ParallelPlan& plan, Backend& backend);

  // Fills every master (and state buffer) with its piece of the seeded global tensor.
  void initialize(uint64_t seed);
  // Binds masters, gradients and state buffers into an executor of the step graph.
  void bind(Executor& ex) const;

  const ParallelPlan& plan() const { return plan_; }
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Device views of one parameter's master and gradient (or a state buffer's tensor).
  Tensor master(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  // Device views of a trainable parameter's AdamW moments (checkpoints).
  Tensor exp_avg(const std::string& name) const;
  Tensor exp_avg_sq(const std::string& name) const;
  // Host copy of a master (tests, checkpoints).
  Tensor master_to_host(const std::string& name) const;
  int64_t trainable_numel() const;
  int64_t bytes() const;

 private:
  Tensor view(const std::string& name, Tensor ParamGroup::*buffer, const char* what) const;
  const ParallelPlan& plan_;
  Backend& backend_;
  std::vector<ParamGroup> groups_;
  std::vector<int> group_of_;  // per plan param (-1 for state buffers)
  std::vector<int64_t> offset_of_;
  std::vector<Tensor> state_;  // per plan param: buffer for non-trainable state
};

}  // namespace meshtrain
