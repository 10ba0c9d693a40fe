// fuse_slice_grads (see header): find add trees whose leaves are single-use slice_backwards of one
// dim and full extent that tile it, then rewrite the root in place (ids stay topological: the
// concat's inputs are the slice_backwards' inputs, made before them).
#include "meshtrain/graph/passes/fuse_slice_grads.h"

#include <algorithm>

#include "meshtrain/ir/op_registry.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain {
namespace {

struct Piece {
  NodeId node;  // the slice_backward
  ValueId dy;
  int64_t start, length;
};

struct Tree {
  std::vector<Piece> pieces;
  std::vector<NodeId> inner_adds;
  int dim = -1;
  int64_t full = -1;
  bool ok = true;
};

// Collects the leaves under value v (consumed only by the tree): slice_backward leaves, add inner
// nodes. Anything else marks the tree unusable.
void collect(const Graph& g, const std::vector<std::vector<NodeId>>& consumers, ValueId v,
             Tree& t) {
  if (!t.ok) return;
  const Value& val = g.value(v);
  if (val.producer == kNoNode || consumers[size_t(v)].size() != 1) {
    t.ok = false;
    return;
  }
  const Node& n = g.node(val.producer);
  const OpDef& def = OpRegistry::instance().op(n.op);
  if (def.sums_inputs) {
    t.inner_adds.push_back(n.id);
    for (ValueId in : n.inputs) collect(g, consumers, in, t);
    return;
  }
  if (!def.pads_slice) {
    t.ok = false;
    return;
  }
  const Shape& out = val.meta.shape;
  const int dim = out.normalize(int(n.attrs.i("dim")));
  const int64_t full = n.attrs.i("full_extent");
  if ((t.dim >= 0 && (dim != t.dim || full != t.full))) {
    t.ok = false;
    return;
  }
  t.dim = dim;
  t.full = full;
  const ValueId dy = n.inputs.at(0);
  t.pieces.push_back({n.id, dy, n.attrs.i("start"), g.value(dy).meta.shape[dim]});
}

}  // namespace

int fuse_slice_grads(Graph& g) {
  const std::vector<std::vector<NodeId>> consumers = g.consumers();
  int rewritten = 0;
  // Latest first: a root is seen before the adds inside it.
  for (NodeId id = g.num_nodes() - 1; id >= 0; --id) {
    Node& root = g.node(id);
    if (root.dead || !OpRegistry::instance().op(root.op).sums_inputs) continue;
    Tree t;
    for (ValueId in : root.inputs) collect(g, consumers, in, t);
    if (!t.ok || t.pieces.size() < 2) continue;
    std::sort(t.pieces.begin(), t.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.start < b.start; });
    int64_t at = 0;
    for (const Piece& p : t.pieces) {
      if (p.start != at) break;
      at += p.length;
    }
    if (at != t.full) continue;  // gaps or overlaps: not a concat
    std::vector<ValueId> inputs;
    for (const Piece& p : t.pieces) {
      inputs.push_back(p.dy);
      g.node(p.node).dead = true;
    }
    for (NodeId a : t.inner_adds) g.node(a).dead = true;
    root.op = ops::kConcatOp;
    root.inputs = std::move(inputs);
    root.attrs = Attrs{{"dim", int64_t(t.dim)}};
    ++rewritten;
  }
  return rewritten;
}

}  // namespace meshtrain
