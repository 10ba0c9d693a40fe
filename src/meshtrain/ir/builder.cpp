// Builder: shape inference at append time, with the scope named in any error it raises.
#include "meshtrain/ir/builder.h"

#include "meshtrain/core/block_name.h"

namespace meshtrain {

Builder::Builder(Graph& graph, NodePhase phase) : graph_(graph), phase_(phase) {}

ValueId Builder::input(const std::string& name, TensorMeta meta) {
  return graph_.add_value(std::move(meta), ValueRole::kInput, name);
}

ValueId Builder::persistent(const std::string& name, TensorMeta meta, ValueRole role) {
  MT_CHECK(is_persistent(role), "persistent value {} with role {}", name, value_role_name(role));
  return graph_.add_value(std::move(meta), role, name);
}

std::vector<ValueId> Builder::op(const std::string& name, std::vector<ValueId> inputs,
                                 Attrs attrs) {
  const OpDef& def = OpRegistry::instance().op(name);
  std::vector<TensorMeta> in_metas;
  in_metas.reserve(inputs.size());
  for (ValueId v : inputs) {
    MT_CHECK(v != kNoValue, "op {} at '{}' was given an undefined input", name, scope_);
    in_metas.push_back(graph_.value(v).meta);
  }
  std::vector<TensorMeta> out_metas;
  try {
    out_metas = def.infer(in_metas, attrs);
  } catch (const Error& e) {
    std::vector<std::string> shapes;
    for (auto& m : in_metas) shapes.push_back(dtype_name(m.dtype) + m.shape.to_string());
    throw ShapeError(
        fmt::format("op {} at '{}' with inputs ({}): {}", name, scope_.empty() ? "<top>" : scope_,
                    fmt::join(shapes, ", "), e.message()),
        __FILE__, __LINE__);
  }
  last_node_ = graph_.add_node(name, std::move(inputs), std::move(out_metas), std::move(attrs),
                               scope_, block_, phase_);
  const Node& n = graph_.node(last_node_);
  if (def.view_of_input >= 0) {
    ValueId src = n.inputs.at(size_t(def.view_of_input));
    const Value& sv = graph_.value(src);
    graph_.value(n.outputs[0]).alias_of = sv.alias_of != kNoValue ? sv.alias_of : src;
  }
  return n.outputs;
}

ValueId Builder::op1(const std::string& name, std::vector<ValueId> inputs, Attrs attrs) {
  std::vector<ValueId> outs = op(name, std::move(inputs), std::move(attrs));
  MT_CHECK(outs.size() == 1, "op {} has {} outputs, op1 expects one", name, outs.size());
  return outs[0];
}

Builder::ScopeGuard::ScopeGuard(Builder& b, const std::string& part, BlockIndex block)
    : b_(b), saved_(b.scope_), saved_block_(b.block_) {
  b_.scope_ = saved_.empty() ? part : saved_ + "." + part;
  if (block != kNoBlock) {
    MT_CHECK(saved_block_ == kNoBlock || saved_block_ == block,
             "block {} opened inside block {} at '{}'", block, saved_block_, b_.scope_);
    b_.block_ = block;
  }
}
Builder::ScopeGuard::~ScopeGuard() {
  b_.scope_ = saved_;
  b_.block_ = saved_block_;
}

Builder::ScopeGuard Builder::block(BlockIndex index) {
  MT_CHECK(index >= 0, "block index must be >= 0, found {}", index);
  return ScopeGuard(*this, block_name(index), index);
}

}  // namespace meshtrain
