// Builder: the API model code, backward rules and passes use to append nodes. It runs each op's
// shape inference (so a bad shape fails where the model asked for it, naming the scope), and
// stamps nodes with the current module scope, block and phase.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/ir/ir.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

class Builder {
 public:
  explicit Builder(Graph& graph, NodePhase phase = NodePhase::kForward);

  Graph& graph() { return graph_; }
  const TensorMeta& meta(ValueId v) const { return graph_.value(v).meta; }
  const Shape& shape(ValueId v) const { return graph_.value(v).meta.shape; }
  DType dtype(ValueId v) const { return graph_.value(v).meta.dtype; }

  // Graph inputs and persistent values (not produced by any node).
  ValueId input(const std::string& name, TensorMeta meta);
  ValueId persistent(const std::string& name, TensorMeta meta, ValueRole role);

  // Appends one node; returns all outputs / the single output.
  std::vector<ValueId> op(const std::string& name, std::vector<ValueId> inputs, Attrs attrs = {});
  ValueId op1(const std::string& name, std::vector<ValueId> inputs, Attrs attrs = {});
  // The node the last op() call appended.
  NodeId last_node() const { return last_node_; }

  // RAII module scope: `auto s = b.scope("attention")` inside block 0 -> "layers.0.attention".
  // With a block index, the nodes appended until the guard ends also carry that block (code
  // that re-enters a block's module path, e.g. the optimizer's load balancing of "layers.1.moe").
  class ScopeGuard {
   public:
    ScopeGuard(Builder& b, const std::string& part, BlockIndex block = kNoBlock);
    ~ScopeGuard();
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;

   private:
    Builder& b_;
    std::string saved_;
    BlockIndex saved_block_;
  };
  [[nodiscard]] ScopeGuard scope(const std::string& part, BlockIndex block = kNoBlock) {
    return ScopeGuard(*this, part, block);
  }
  // RAII transformer block `index`: the scope part block_name(index) ("layers.<index>",
  // core/block_name.h) and the block index on every node appended inside.
  [[nodiscard]] ScopeGuard block(BlockIndex index);
  const std::string& current_scope() const { return scope_; }
  BlockIndex current_block() const { return block_; }
  // Backward rules and passes re-enter a forward node's place: its scope and its block.
  void set_scope(std::string s, BlockIndex block) {
    scope_ = std::move(s);
    block_ = block;
  }

  NodePhase phase() const { return phase_; }
  void set_phase(NodePhase p) { phase_ = p; }

 private:
  Graph& graph_;
  NodePhase phase_;
  std::string scope_;
  BlockIndex block_ = kNoBlock;
  NodeId last_node_ = kNoNode;
};

}  // namespace meshtrain
