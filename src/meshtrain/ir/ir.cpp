// Graph storage and queries.
#include "meshtrain/ir/ir.h"

#include <algorithm>

namespace meshtrain {

const char* value_role_name(ValueRole r) {
  switch (r) {
    case ValueRole::kActivation: return "activation";
    case ValueRole::kInput: return "input";
    case ValueRole::kParameter: return "parameter";
    case ValueRole::kGradient: return "gradient";
    case ValueRole::kState: return "state";
    case ValueRole::kComputeCopy: return "compute copy";
  }
  return "?";
}

const char* node_phase_name(NodePhase p) {
  switch (p) {
    case NodePhase::kForward: return "forward";
    case NodePhase::kBackward: return "backward";
    case NodePhase::kRecompute: return "recompute";
    case NodePhase::kOptimizer: return "optimizer";
  }
  return "?";
}

ValueId Graph::add_value(TensorMeta meta, ValueRole role, std::string name) {
  Value v;
  v.id = ValueId(values_.size());
  v.meta = std::move(meta);
  v.role = role;
  v.name = std::move(name);
  values_.push_back(std::move(v));
  return values_.back().id;
}

NodeId Graph::add_node(std::string op, std::vector<ValueId> inputs,
                       std::vector<TensorMeta> out_metas, Attrs attrs, std::string scope,
                       BlockIndex block, NodePhase phase) {
  for (ValueId in : inputs)
    MT_CHECK(in >= 0 && in < num_values(), "op {} input value {} does not exist", op, in);
  Node n;
  n.id = NodeId(nodes_.size());
  n.op = std::move(op);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.scope = std::move(scope);
  n.block = block;
  n.phase = phase;
  for (size_t i = 0; i < out_metas.size(); ++i) {
    ValueId v = add_value(std::move(out_metas[i]), ValueRole::kActivation,
                          out_metas.size() == 1 ? n.op : fmt::format("{}.{}", n.op, i));
    values_[v].producer = n.id;
    n.outputs.push_back(v);
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().id;
}

const Value& Graph::value(ValueId v) const {
  MT_CHECK(v >= 0 && v < num_values(), "value {} out of range", v);
  return values_[v];
}
Value& Graph::value(ValueId v) {
  MT_CHECK(v >= 0 && v < num_values(), "value {} out of range", v);
  return values_[v];
}
const Node& Graph::node(NodeId n) const {
  MT_CHECK(n >= 0 && n < num_nodes(), "node {} out of range", n);
  return nodes_[n];
}
Node& Graph::node(NodeId n) {
  MT_CHECK(n >= 0 && n < num_nodes(), "node {} out of range", n);
  return nodes_[n];
}

void Graph::mark_output(ValueId v) {
  value(v);
  if (std::find(outputs_.begin(), outputs_.end(), v) == outputs_.end()) outputs_.push_back(v);
}

int Graph::add_scalar(const std::string& name) {
  for (size_t i = 0; i < scalars_.size(); ++i)
    if (scalars_[i] == name) return int(i);
  scalars_.push_back(name);
  return int(scalars_.size()) - 1;
}

std::vector<NodeId> Graph::schedule() const {
  std::vector<NodeId> order;
  if (!schedule_.empty()) {
    order.reserve(schedule_.size());
    std::vector<char> seen(nodes_.size(), 0);
    for (NodeId id : schedule_)
      if (!nodes_[size_t(id)].dead) {
        order.push_back(id);
        seen[size_t(id)] = 1;
      }
    for (const Node& n : nodes_)
      MT_CHECK(n.dead || seen[size_t(n.id)], "node {} ({}) was added after the schedule was set",
               n.id, n.op);
    return order;
  }
  order.reserve(nodes_.size());
  for (const Node& n : nodes_)
    if (!n.dead) order.push_back(n.id);
  return order;
}

std::vector<std::vector<NodeId>> Graph::consumers() const {
  std::vector<std::vector<NodeId>> c(values_.size());
  for (const Node& n : nodes_) {
    if (n.dead) continue;
    for (ValueId in : n.inputs)
      if (c[in].empty() || c[in].back() != n.id) c[in].push_back(n.id);
  }
  return c;
}

std::vector<ValueId> Graph::values_with_role(ValueRole role) const {
  std::vector<ValueId> out;
  for (const Value& v : values_)
    if (v.role == role) out.push_back(v.id);
  return out;
}

std::string Graph::dump() const {
  std::string s;
  auto fmt_value = [&](ValueId v) {
    const Value& x = values_[v];
    return fmt::format("%{}:{}{}", v, dtype_name(x.meta.dtype), x.meta.shape.to_string());
  };
  for (NodeId id : schedule()) {
    const Node& n = nodes_[id];
    std::vector<std::string> outs, ins;
    for (ValueId v : n.outputs) outs.push_back(fmt_value(v));
    for (ValueId v : n.inputs) ins.push_back(fmt_value(v));
    s += fmt::format("{:>5} {}[{}:{}] {} = {}({}){}{}\n", n.id,
                     n.phase == NodePhase::kRecompute ? "*" : " ", node_phase_name(n.phase),
                     n.stream, fmt::join(outs, ", "), n.op, fmt::join(ins, ", "),
                     n.attrs.items().empty() ? "" : " {" + n.attrs.to_string() + "}",
                     n.scope.empty() ? "" : "  @" + n.scope);
  }
  return s;
}

}  // namespace meshtrain
