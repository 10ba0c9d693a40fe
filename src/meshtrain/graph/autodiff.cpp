// Autodiff: walks nodes in reverse creation order (a reverse topological order), restricted to
// nodes that lie on a path from a `wrt` value to the loss.
#include "meshtrain/graph/autodiff.h"

#include "meshtrain/ir/builder.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {

GradientMap differentiate(Graph& graph, ValueId loss, const std::vector<ValueId>& wrt) {
  const OpRegistry& reg = OpRegistry::instance();
  MT_CHECK(graph.value(loss).meta.numel() == 1, "loss must be a scalar, found shape {}",
           graph.value(loss).meta.shape);
  const int n_nodes = graph.num_nodes();

  // Forward reachability from wrt, backward reachability to loss.
  std::vector<char> from_wrt(size_t(graph.num_values()), 0), to_loss(size_t(graph.num_values()), 0);
  for (ValueId v : wrt) from_wrt[v] = 1;
  for (NodeId i = 0; i < n_nodes; ++i) {
    const Node& n = graph.node(i);
    if (n.dead || !reg.op(n.op).backward) continue;
    bool any = false;
    for (ValueId in : n.inputs) any |= bool(from_wrt[in]);
    if (any)
      for (ValueId out : n.outputs) from_wrt[out] = 1;
  }
  to_loss[loss] = 1;
  for (NodeId i = n_nodes - 1; i >= 0; --i) {
    const Node& n = graph.node(i);
    if (n.dead) continue;
    bool any = false;
    for (ValueId out : n.outputs) any |= bool(to_loss[out]);
    if (any)
      for (ValueId in : n.inputs) to_loss[in] = 1;
  }

  Builder b(graph, NodePhase::kBackward);
  std::vector<ValueId> grad(size_t(graph.num_values()), kNoValue);
  auto accumulate = [&](ValueId v, ValueId g) {
    if (g == kNoValue) return;
    const TensorMeta& vm = graph.value(v).meta;
    const TensorMeta& gm = graph.value(g).meta;
    MT_CHECK(vm.shape == gm.shape, "gradient of value %{} ({}) has shape {}", v, vm.shape,
             gm.shape);
    // A gradient may carry another dtype than its value (grad_cast); fan-in adds in the dtype
    // of the first gradient that arrived.
    if (grad[v] == kNoValue) {
      grad[v] = g;
      return;
    }
    DType want = graph.value(grad[v]).meta.dtype;
    if (gm.dtype != want) g = ops::cast(b, g, want);
    grad[v] = ops::add(b, grad[v], g);
  };

  if (const NodeId p = graph.value(loss).producer; p >= 0)
    b.set_scope(graph.node(p).scope, graph.node(p).block);
  grad[loss] = ops::fill(b, graph.value(loss).meta.shape, graph.value(loss).meta.dtype, 1.0);

  for (NodeId i = n_nodes - 1; i >= 0; --i) {
    // Copy: backward rules append nodes, which may reallocate the node array.
    const Node node = graph.node(i);
    if (node.dead) continue;
    const OpDef& def = reg.op(node.op);
    bool has_grad = false;
    std::vector<ValueId> gouts;
    for (ValueId out : node.outputs) {
      gouts.push_back(grad[out]);
      has_grad |= grad[out] != kNoValue;
    }
    if (!has_grad) continue;
    std::vector<bool> needs(node.inputs.size(), false);
    bool any_needed = false;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      ValueId in = node.inputs[k];
      needs[k] = from_wrt[in] && to_loss[in] && is_floating(graph.value(in).meta.dtype);
      any_needed |= needs[k];
    }
    if (!any_needed) continue;
    MT_CHECK(bool(def.backward), "op {} at '{}' is on the path to the loss but has no backward",
             node.op, node.scope);
    b.set_scope(node.scope, node.block);  // backward nodes sit in their forward node's block
    GradContext ctx{b, node, gouts, needs};
    std::vector<ValueId> gins = def.backward(ctx);
    MT_CHECK(gins.size() == node.inputs.size(), "backward of {} returned {} grads for {} inputs",
             node.op, gins.size(), node.inputs.size());
    for (size_t k = 0; k < node.inputs.size(); ++k)
      if (needs[k]) accumulate(node.inputs[k], gins[k]);
  }

  GradientMap result;
  for (ValueId v : wrt) result.grads[v] = grad[v];
  return result;
}

int eliminate_dead_nodes(Graph& graph) {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<char> needed(size_t(graph.num_values()), 0);
  for (ValueId v : graph.outputs()) needed[v] = 1;
  int removed = 0;
  for (NodeId i = graph.num_nodes() - 1; i >= 0; --i) {
    Node& n = graph.node(i);
    if (n.dead) continue;
    bool live = reg.op(n.op).side_effect;
    for (ValueId out : n.outputs) live |= bool(needed[out]);
    if (!live) {
      n.dead = true;
      ++removed;
      continue;
    }
    for (ValueId in : n.inputs) needed[in] = 1;
  }
  return removed;
}

}  // namespace meshtrain
