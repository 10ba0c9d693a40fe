// ParamStore: owns the persistent training state of this rank in flat device buffers, one set
// per norm group (parameters whose shards combine over the same mesh groups): master weights,
// gradient accumulators, the two AdamW moments and, under mixed precision, the compute-dtype
// copies of the masters, laid out identically so the optimizer runs one fused pass per group.
// Rule: a compute copy always equals cast(master); whoever writes masters outside the optimizer
// says so (masters_written) and the copies are cast again before the next step reads them.
// Non-trainable state (expert_bias, ...) has its own buffers.
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
  // Whether some parameter of the group has a compute copy (ParamInfo::compute), and its dtype
  // (the plan's compute dtype); `compute` then spans the whole group, like the master.
  bool has_compute = false;
  DType compute_dtype = DType::kF32;
  Tensor master, grad, exp_avg, exp_avg_sq, compute;
};

// The norm groups of a plan's trainable parameters (first-seen order) and each parameter's offset
// in its group's flat buffers, without allocating them (tensors left undefined).
std::vector<ParamGroup> layout_param_groups(const ParallelPlan& plan);

class ParamStore {
 public:
  ParamStore(const ParallelPlan& plan, Backend& backend);
  ~ParamStore();

  // Fills every master (and state buffer) with its piece of the seeded global tensor, then the
  // compute copies from the masters.
  void initialize(uint64_t seed);
  // Binds masters, compute copies, gradients and state buffers into an executor of the step
  // graph (or of a forward graph of the same plan's parameters).
  void bind(Executor& ex) const;

  // Masters were written outside the optimizer (a checkpoint or HF load, a test): the compute
  // copies are stale until sync_compute_copies().
  void masters_written() { copies_stale_ = true; }
  bool copies_stale() const { return copies_stale_; }
  // Casts every master into its compute copy if masters were written since the last cast (the
  // trainer calls it before each step); enqueued on stream 0, no allocation. No-op without copies.
  void sync_compute_copies();
  bool has_compute_copies() const;

  const ParallelPlan& plan() const { return plan_; }
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Device views of one parameter's master and gradient (or a state buffer's tensor).
  Tensor master(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  // Device views of a trainable parameter's AdamW moments (checkpoints).
  Tensor exp_avg(const std::string& name) const;
  Tensor exp_avg_sq(const std::string& name) const;
  // Device view of a trainable parameter's compute copy (ParamInfo::compute must be set).
  Tensor compute_copy(const std::string& name) const;
  // Host copy of a master (tests, checkpoints).
  Tensor master_to_host(const std::string& name) const;
  int64_t trainable_numel() const;
  int64_t bytes() const;

 private:
  Tensor view(const std::string& name, Tensor ParamGroup::*buffer, const char* what) const;
  void build_refresh();
  const ParallelPlan& plan_;
  Backend& backend_;
  std::vector<ParamGroup> groups_;
  // The cast of every group's master into its compute copy (cast_into, the forward cast's
  // kernel): a graph of its own, prepared once.
  Graph refresh_graph_;
  std::unique_ptr<Executor> refresh_;
  bool copies_stale_ = false;
  std::vector<int> group_of_;  // per plan param (-1 for state buffers)
  std::vector<int64_t> offset_of_;
  std::vector<Tensor> state_;  // per plan param: buffer for non-trainable state
};

}  // namespace meshtrain
