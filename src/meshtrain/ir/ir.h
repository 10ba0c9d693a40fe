// The step-graph IR: Values (typed tensors with a role) produced and consumed by Nodes (ops with
// attributes). Node ids are creation order, which is always a topological order; passes that
// reorder work write `schedule`, never renumber. Shapes are local (per rank) and static.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/shape.h"
#include "meshtrain/ir/attrs.h"

namespace meshtrain {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;
constexpr NodeId kNoNode = -1;
// The transformer block a node belongs to (0-based, the N of scope "layers.N"), stamped by the
// Builder while a model has a block open; passes decide by it, never by the scope's text.
using BlockIndex = int32_t;
constexpr BlockIndex kNoBlock = -1;

struct TensorMeta {
  Shape shape;
  DType dtype = DType::kF32;
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
  bool operator==(const TensorMeta&) const = default;
};

enum class ValueRole : uint8_t {
  kActivation,  // produced by a node; lives in the activation arena for its live range
  kInput,       // written by the host before each micro-batch (tokens, labels, token count)
  kParameter,   // persistent master weight (this rank's shard), updated by the optimizer
  kGradient,    // persistent gradient accumulator of a parameter shard
  kState,       // other persistent tensors (optimizer moments, expert bias, load counters)
  // Persistent compute-dtype copy of a master (mixed precision): what the forward reads, kept
  // equal to cast(master) by the optimizer's update and by ParamStore after masters are loaded.
  kComputeCopy,
};
const char* value_role_name(ValueRole r);
inline bool is_persistent(ValueRole r) {
  return r == ValueRole::kParameter || r == ValueRole::kGradient || r == ValueRole::kState ||
         r == ValueRole::kComputeCopy;
}

enum class NodePhase : uint8_t { kForward, kBackward, kRecompute, kOptimizer };
const char* node_phase_name(NodePhase p);

struct Value {
  ValueId id = kNoValue;
  TensorMeta meta;
  ValueRole role = ValueRole::kActivation;
  NodeId producer = kNoNode;
  std::string name;
  // View ops (reshape) produce values that share their input's memory.
  ValueId alias_of = kNoValue;
};

struct Node {
  NodeId id = kNoNode;
  std::string op;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string scope;  // module path, e.g. "layers.3.attention" (traces, errors, recompute)
  BlockIndex block = kNoBlock;  // e.g. 3 for that scope; kNoBlock outside the blocks
  NodePhase phase = NodePhase::kForward;
  int stream = 0;     // 0 = compute stream; passes assign communication streams
  bool dead = false;  // removed by a pass; kept in the array so ids stay stable
};

class Graph {
 public:
  ValueId add_value(TensorMeta meta, ValueRole role, std::string name);
  // Appends a node whose outputs are new activation values with the given metas.
  NodeId add_node(std::string op, std::vector<ValueId> inputs, std::vector<TensorMeta> out_metas,
                  Attrs attrs, std::string scope, BlockIndex block, NodePhase phase);

  const Value& value(ValueId v) const;
  Value& value(ValueId v);
  const Node& node(NodeId n) const;
  Node& node(NodeId n);
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  int num_values() const { return int(values_.size()); }
  int num_nodes() const { return int(nodes_.size()); }

  // Values the host reads after a run (loss, grad norm); they live until the run ends.
  void mark_output(ValueId v);
  const std::vector<ValueId>& outputs() const { return outputs_; }

  // Execution order of live nodes: the schedule a pass set (it must then list every live node),
  // or creation order.
  std::vector<NodeId> schedule() const;
  void set_schedule(std::vector<NodeId> order) { schedule_ = std::move(order); }

  // consumers[v] = live nodes that read v, in creation order.
  std::vector<std::vector<NodeId>> consumers() const;
  std::vector<ValueId> values_with_role(ValueRole role) const;

  // Host scalars: values the host sets before each run (learning rate, step) that kernels read
  // at launch, so no host-to-device copy races with a running step. Returns the slot.
  int add_scalar(const std::string& name);
  const std::vector<std::string>& scalar_names() const { return scalars_; }

  // The IR in schedule order, one node per line: id, phase (recomputed nodes marked `*`), stream,
  // outputs = op(inputs), attributes, scope. For debugging; the listing with the memory plan and
  // collective bytes that `meshtrain plan --dump-graph` prints is graph/graph_dump.h.
  std::string dump() const;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
  std::vector<NodeId> schedule_;
  std::vector<std::string> scalars_;
};

}  // namespace meshtrain
