// ParallelPlan: what `param(name)` means on this rank. Model code declares each parameter with
// its torchtitan name, global shape and initialiser; the plan creates the persistent master
// value (this rank's shard), and returns the value the model computes with: in the compute dtype
// (a persistent compute copy under mixed precision, else a cast) and, under FSDP, all-gathered
// from the shards (autodiff then reduce-scatters the gradient). Gradients are accumulated into
// persistent per-parameter buffers.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshtrain/graph/autodiff.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/parallel/placement.h"
#include "meshtrain/tensor/init.h"

namespace meshtrain {

class GroupLayout;

enum class ParamKind : uint8_t { kDense, kExpert };

// How a dense weight [out, in] is split over the `tp` group (Megatron): column-parallel shards
// the output features (dim 0), row-parallel the input features (dim 1); replicated weights get
// their partial per-rank gradients summed over tp.
enum class TpStyle : uint8_t { kReplicate, kColwise, kRowwise };

struct ParamOptions {
  ParamKind kind = ParamKind::kDense;
  bool trainable = true;
  TpStyle tp = TpStyle::kReplicate;
  // What the model computes with for this parameter; unset = PlanConfig::compute_dtype. The MoE
  // router gate stays float32 in bfloat16 runs this way (torchtitan routes in float32).
  std::optional<DType> compute_dtype;
};

// One MoE layer's auxiliary-loss-free load balancing, recorded by the model: the buffers (declared
// with buffer(), all [num_experts] of one float dtype) that the optimizer step reads and updates.
struct LoadBalanceLayer {
  std::string layer;              // module path, e.g. "layers.1.moe"
  BlockIndex block = kNoBlock;    // the transformer block it sits in, e.g. 1
  std::string expert_bias;        // "layers.1.moe.expert_bias": read by the router
  std::string tokens_per_expert;  // counter the forward accumulates into, reset by the update
  std::string last_load;          // the counts of the last step, for metrics
  int64_t num_experts = 0;
  double coeff = 0;  // load_balance_coeff; 0 = the bias never moves
};

struct ParamInfo {
  std::string name;
  Shape global_shape;
  Shape local_shape;  // this rank's master shard (padded to equal sizes when sharded)
  LocalPiece piece;   // where the shard sits in the global tensor
  InitSpec init;
  ParamKind kind = ParamKind::kDense;
  bool trainable = true;
  DType dtype = DType::kF32;  // of the master (master_dtype) or of a state buffer
  ValueId master = kNoValue;  // persistent value (role kParameter, or kState if not trainable)
  ValueId grad = kNoValue;    // persistent accumulator (role kGradient)
  // Mixed precision (PlanConfig::compute_copies, a trainable parameter computed in
  // PlanConfig::compute_dtype != dtype): the persistent copy `<name>.compute` of the master in the
  // compute dtype (role kComputeCopy, local_shape) that the forward reads in place of
  // cast(master); ParamStore keeps it equal to cast(master). kNoValue: the forward casts.
  ValueId compute = kNoValue;
  // The value the forward reads and autodiff differentiates against: compute, else master.
  ValueId weight() const { return compute != kNoValue ? compute : master; }
  int shard_degree = 1;  // ranks the master is split over (1 = replicated/whole)
  // Mesh groups over which the master's shards are disjoint, in reduction order ({fsdp},
  // {fsdp, tp}; empty when whole): the gradient-norm all-reduces run over these.
  std::vector<MeshGroup> shard_groups;
  // The master's placement on each mesh group it spans, e.g. {fsdp: Shard(0), dp_replicate:
  // Replicate()}; groups of size 1 are left out.
  std::vector<std::pair<MeshGroup, Placement>> placements;
  std::string placement_string() const;
};

// Default [parallelism] expert_capacity_factor: see the key's help in train/job_config.cpp for
// the measured routing it is chosen from.
inline constexpr double kDefaultExpertCapacityFactor = 1.25;

struct PlanConfig {
  DType master_dtype = DType::kF32;  // master weights and optimizer state
  DType compute_dtype =
      DType::kF32;  // what the model computes with ([training] mixed_precision_param)
  DType reduce_dtype = DType::kF32;  // gradient reductions ([training] mixed_precision_reduce)
  // [training] compute_weight_copies: trainable parameters computed in compute_dtype (!=
  // master_dtype) read a persistent compute copy that the optimizer writes (ParamInfo::compute);
  // false: every micro-batch casts every master.
  bool compute_copies = true;
  // Rows an EP rank's expert buffers are planned for, as a multiple of the rows it routes
  // ([parallelism] expert_capacity_factor; see moe/expert_exchange.h).
  double expert_capacity_factor = kDefaultExpertCapacityFactor;
  // [parallelism] expert_exchange = "padded": the exchange without a host wait
  // (moe/padded_exchange.h).
  bool expert_exchange_padded = false;
};

// Expert-major rows and the groups [2, experts] that describe them, on either side of the
// expert-parallel exchange.
struct ExpertRows {
  ValueId x = kNoValue;
  ValueId groups = kNoValue;
  ValueId recv_counts = kNoValue;  // set after to_local_experts: the exchange's layout
  int64_t block_rows = 0;          // > 0: the exchange may run padded (moe/padded_exchange.h)
};

class ParallelPlan {
 public:
  // `layout` may be null: every group has size 1 (one rank).
  ParallelPlan(PlanConfig config, const GroupLayout* layout);

  // Declares a trainable parameter and returns the value the model should use.
  ValueId param(Builder& b, const std::string& name, const Shape& global_shape,
                const InitSpec& init, ParamOptions options = {});
  // Declares non-trainable persistent state read by the graph (e.g. expert_bias); returned as is.
  ValueId buffer(Builder& b, const std::string& name, const Shape& shape, DType dtype,
                 const InitSpec& init);

  // Records a MoE layer's load-balancing buffers (checked to be declared buffers of one shape).
  void add_load_balance_layer(LoadBalanceLayer layer);
  const std::vector<LoadBalanceLayer>& load_balance_layers() const { return load_balance_; }

  // After autodiff: appends `accumulate(grad_buffer, grad)` sinks for every trainable param.
  // overwrite: one micro-batch per step, so the gradients are written outright (no zeroing).
  void attach_gradients(Builder& b, const GradientMap& grads, bool overwrite = false);
  std::vector<ValueId> trainable_masters() const;
  // What autodiff differentiates against: each trainable parameter's weight() (its compute copy
  // under mixed precision, else its master); attach_gradients reads their gradients.
  std::vector<ValueId> trainable_weights() const;

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& info(const std::string& name) const;
  const PlanConfig& config() const { return config_; }
  // Size of / this rank's index in a mesh group (1 / 0 without a mesh).
  int group_size(MeshGroup group) const;
  int group_rank(MeshGroup group) const;

  // Degrees the model needs to size its local shapes (1 when the dim is absent).
  int tp_degree() const;

  // Tensor parallel with sequence parallel. Between blocks the residual stream is Shard(0) on tp
  // over the flattened tokens [T/tp, D] (norms, residual adds and the loss run on a token shard);
  // a block's column-parallel matmuls see all tokens, its row-parallel output is Partial.
  // shard_tokens: [T, ...] identical on every tp rank -> this rank's rows [T/tp, ...].
  ValueId shard_tokens(Builder& b, ValueId x) const;
  // tp_enter: [T/tp, D] token shard -> [T, D] (all_gather; backward reduce_scatter).
  ValueId tp_enter(Builder& b, ValueId x) const;
  // tp_exit: [T, D] partial sums of a row-parallel matmul -> [T/tp, D] (reduce_scatter).
  ValueId tp_exit(Builder& b, ValueId y) const;

  // Expert parallelism: rows of this rank's expert-major buffer (all experts, unpadded) to the
  // ranks of the ep group owning their experts, regrouped by local expert and padded to
  // `alignment`; and the reverse for the experts' output. `capacity` = rows of the source buffer.
  ExpertRows to_local_experts(Builder& b, ValueId x_perm, ValueId groups, int64_t capacity,
                              int64_t alignment) const;
  ValueId from_local_experts(Builder& b, ValueId y_local, const ExpertRows& local, ValueId groups,
                             int64_t capacity) const;

 private:
  ParamInfo& declare(const std::string& name, const Shape& global_shape, const InitSpec& init,
                     ParamOptions options);
  PlanConfig config_;
  const GroupLayout* layout_;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<LoadBalanceLayer> load_balance_;
};

}  // namespace meshtrain
