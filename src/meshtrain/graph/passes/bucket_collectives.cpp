// The bucketing pass: pick the parameter collectives, group them into buckets, replace each
// bucket by one node and move the nodes it depends on (or that depend on it) around it. The
// prefetch pass then moves each parameter gather ahead by a bounded number of gathers.
#include "meshtrain/graph/passes/bucket_collectives.h"

#include <algorithm>
#include <compare>
#include <map>
#include <set>
#include <tuple>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {
namespace {

// The longest common dotted prefix of two scopes.
std::string common_scope(const std::string& a, const std::string& b) {
  size_t n = 0;
  for (size_t i = 0; i <= std::min(a.size(), b.size()); ++i) {
    const bool end_a = i == a.size() || a[i] == '.';
    const bool end_b = i == b.size() || b[i] == '.';
    if (end_a && end_b) n = i;
    if (i == a.size() || i == b.size() || a[i] != b[i]) break;
  }
  return a.substr(0, n);
}

class Picker {
 public:
  explicit Picker(const Graph& g) : g_(g), consumers_(g.consumers()) {}

  // Computed from persistent values only (no activation, input or collective on the way).
  bool from_persistent(ValueId v) {
    auto it = from_persistent_.find(v);
    if (it != from_persistent_.end()) return it->second;
    const Value& val = g_.value(v);
    bool ok = false;
    if (val.producer == kNoNode) {
      ok = is_persistent(val.role);
    } else {
      const Node& p = g_.node(val.producer);
      ok = !reg_.op(p.op).is_collective() && !p.inputs.empty();
      for (ValueId in : p.inputs) ok = ok && from_persistent(in);
    }
    return from_persistent_[v] = ok;
  }

  // Flows only into side-effect sinks, through casts and views.
  bool into_sinks(ValueId v) {
    const auto& cs = consumers_[size_t(v)];
    if (cs.empty()) return false;
    for (NodeId c : cs) {
      const Node& n = g_.node(c);
      const OpDef& d = reg_.op(n.op);
      if (d.side_effect) continue;
      // HSDP: a reduce-scatter's shard is then summed over the replicas (an all-reduce per
      // tensor, left as it is) before it reaches the accumulator.
      const bool passes =
          d.cast || d.view_of_input >= 0 || d.rearranges || d.collective == Collective::kAllReduce;
      if (!passes || n.outputs.size() != 1 || !into_sinks(n.outputs[0])) return false;
    }
    return true;
  }

  // A parameter gather, a gradient reduce-scatter or a backward gradient all-reduce (HSDP's
  // replicas, DDP, the TP sum of a replicated parameter's gradient); a bucket of them too.
  bool is_parameter_collective(const Node& n) {
    if (n.dead || n.inputs.empty()) return false;
    const Collective c = reg_.op(n.op).collective;
    bool all = c == Collective::kAllGather || c == Collective::kReduceScatter ||
               (c == Collective::kAllReduce && n.phase == NodePhase::kBackward);
    for (size_t i = 0; all && i < n.inputs.size(); ++i)
      all = c == Collective::kAllGather ? from_persistent(n.inputs[i]) : into_sinks(n.outputs[i]);
    return all;
  }

 private:
  const Graph& g_;
  const OpRegistry& reg_ = OpRegistry::instance();
  std::vector<std::vector<NodeId>> consumers_;
  std::map<ValueId, bool> from_persistent_;
};

struct Bucket {
  std::vector<NodeId> members;  // schedule order
  int64_t bytes = 0;
};

// Points every reader of `from` at `to` (inputs and view aliases).
void rewire(Graph& g, ValueId from, ValueId to) {
  for (Node& n : g.nodes()) {
    if (n.dead) continue;
    for (ValueId& in : n.inputs)
      if (in == from) in = to;
  }
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (g.value(v).alias_of == from) g.value(v).alias_of = to;
  const auto& outs = g.outputs();
  MT_CHECK(std::find(outs.begin(), outs.end(), from) == outs.end(),
           "bucketing: value {} is a graph output; bucketed collectives never are", from);
}

// One node for the bucket, with the members' op and attributes; the members die.
NodeId merge(Graph& g, const Bucket& b) {
  const Node& first = g.node(b.members[0]);
  std::vector<ValueId> inputs;
  std::vector<TensorMeta> in_metas;
  std::string scope = first.scope;
  bool one_block = true;
  for (NodeId m : b.members) {
    inputs.push_back(g.node(m).inputs[0]);
    in_metas.push_back(g.value(inputs.back()).meta);
    scope = common_scope(scope, g.node(m).scope);
    one_block &= g.node(m).block == first.block;
  }
  // The bucket's block goes with its scope: the members' common one; with no common scope the
  // first member's scope, and so its block; a common scope above the blocks ("layers"), none.
  const BlockIndex block = one_block || scope.empty() ? first.block : kNoBlock;
  const OpDef& def = OpRegistry::instance().op(first.op);
  std::vector<TensorMeta> out_metas = def.infer(in_metas, first.attrs);
  const NodeId id = g.add_node(first.op, inputs, out_metas, first.attrs,
                               scope.empty() ? first.scope : scope, block, first.phase);
  for (size_t i = 0; i < b.members.size(); ++i) {
    Node& m = g.node(b.members[i]);
    const ValueId old = m.outputs[0];
    const ValueId now = g.node(id).outputs[i];
    g.value(now).name = g.value(old).name;
    m.dead = true;
    rewire(g, old, now);
  }
  return id;
}

// Closure of `start` over producers (up) or consumers (down), live nodes only.
std::set<NodeId> closure(const Graph& g, const std::vector<std::vector<NodeId>>& consumers,
                         const std::vector<NodeId>& start, bool up) {
  std::set<NodeId> seen;
  std::vector<NodeId> stack = start;
  while (!stack.empty()) {
    const Node& n = g.node(stack.back());
    stack.pop_back();
    if (up) {
      for (ValueId v : n.inputs) {
        NodeId p = g.value(v).producer;
        if (p != kNoNode && !g.node(p).dead && seen.insert(p).second) stack.push_back(p);
      }
    } else {
      for (ValueId v : n.outputs)
        for (NodeId c : consumers[size_t(v)])
          if (seen.insert(c).second) stack.push_back(c);
    }
  }
  return seen;
}

}  // namespace

BucketStats bucket_collectives(Graph& graph, const BucketOptions& options) {
  BucketStats stats;
  std::vector<NodeId> order = graph.schedule();
  Picker pick(graph);

  // Buckets, in schedule order of their first member. Key: kind, phase, group, group size
  // (gathers, reduce-scatters), reduce op and gradient rule (all-reduces), dtype and (block
  // mode) the block, or (root: true) the last block seen before a root collective.
  struct Where {
    bool root = false;
    BlockIndex block = kNoBlock;
    auto operator<=>(const Where&) const = default;
  };
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int, Where>;
  std::map<Key, size_t> open;
  std::vector<Bucket> buckets;
  std::map<NodePhase, BlockIndex> last_block;
  const OpRegistry& reg = OpRegistry::instance();
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    if (n.block != kNoBlock) last_block[n.phase] = n.block;
    if (n.inputs.size() != 1 || !pick.is_parameter_collective(n)) continue;
    ++stats.collectives_before;
    const int64_t bytes = int64_t(graph.value(n.inputs[0]).meta.nbytes());
    Where where;
    if (options.mode == BucketMode::kTransformerBlock) {
      const auto last = last_block.find(n.phase);
      where = n.block != kNoBlock ? Where{false, n.block}
                                  : Where{true, last == last_block.end() ? kNoBlock : last->second};
    }
    const Key key{int(reg.op(n.op).collective),
                  int(n.phase),
                  n.attrs.i("group"),
                  n.attrs.i("group_size", 0),
                  n.attrs.i("reduce_op", -1),
                  n.attrs.i("grad", -1),
                  int(graph.value(n.inputs[0]).meta.dtype),
                  where};
    auto it = open.find(key);
    const bool full = it != open.end() && options.mode == BucketMode::kSize &&
                      buckets[it->second].bytes >= options.bucket_bytes;
    if (options.mode == BucketMode::kNone || it == open.end() || full) {
      it = open.insert_or_assign(key, buckets.size()).first;
      buckets.emplace_back();
    }
    buckets[it->second].members.push_back(id);
    buckets[it->second].bytes += bytes;
  }

  for (const Bucket& b : buckets) {
    ++stats.collectives_after;
    if (b.members.size() < 2) continue;
    ++stats.buckets;
    // Gathers run at their first member; reduce-scatters and all-reduces at their last.
    const bool gather = reg.op(graph.node(b.members[0]).op).collective == Collective::kAllGather;
    const auto consumers = graph.consumers();
    std::map<NodeId, size_t> pos;
    for (size_t p = 0; p < order.size(); ++p) pos[order[p]] = p;
    const std::set<NodeId> members(b.members.begin(), b.members.end());
    // Gathers run at the first member and pull their producers up; reduce-scatters run at the
    // last member and push their consumers down.
    const size_t at = gather ? pos.at(b.members.front()) : pos.at(b.members.back());
    std::set<NodeId> moved;
    for (NodeId n : closure(graph, consumers, b.members, gather))
      if (!members.count(n) && (gather ? pos.at(n) > at : pos.at(n) < at)) moved.insert(n);
    const NodeId merged = merge(graph, b);
    std::vector<NodeId> next;
    next.reserve(order.size());
    std::vector<NodeId> moved_in_order;
    for (NodeId n : order)
      if (moved.count(n)) moved_in_order.push_back(n);
    for (size_t p = 0; p < order.size(); ++p) {
      const NodeId n = order[p];
      if (p == at) {
        if (gather) next.insert(next.end(), moved_in_order.begin(), moved_in_order.end());
        next.push_back(merged);
        if (!gather) next.insert(next.end(), moved_in_order.begin(), moved_in_order.end());
      }
      if (!members.count(n) && !moved.count(n)) next.push_back(n);
    }
    order = std::move(next);
  }
  graph.set_schedule(order);
  return stats;
}

PrefetchStats prefetch_gathers(Graph& graph, int max_gathered_blocks) {
  PrefetchStats stats;
  const int ahead = max_gathered_blocks - 1;
  if (ahead <= 0) return stats;
  std::vector<NodeId> order = graph.schedule();
  Picker pick(graph);
  const OpRegistry& reg = OpRegistry::instance();
  auto is_gather = [&](const Node& n) {
    return reg.op(n.op).collective == Collective::kAllGather && pick.is_parameter_collective(n);
  };
  // Nodes that never anchor a move: the gathers and their parameter-only producers (they move).
  std::set<NodeId> movable;
  std::map<std::pair<int, int64_t>, std::vector<NodeId>> chains;  // (phase, group) -> gathers
  NodeId backward_start = kNoNode;
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    if (backward_start == kNoNode && n.phase == NodePhase::kBackward) backward_start = id;
    if (is_gather(n)) {
      movable.insert(id);
      if (n.phase == NodePhase::kForward || n.phase == NodePhase::kRecompute)
        chains[{int(n.phase), n.attrs.i("group")}].push_back(id);
    } else if (!n.outputs.empty() && pick.from_persistent(n.outputs[0])) {
      movable.insert(id);
    }
  }
  // Each gather's anchor (the node it will run right before), from the order before any move.
  std::vector<std::pair<NodeId, NodeId>> moves;  // (gather, anchor)
  {
    std::map<NodeId, size_t> pos;
    for (size_t p = 0; p < order.size(); ++p) pos[order[p]] = p;
    auto first_fixed_after = [&](NodeId n) {
      for (size_t p = pos.at(n) + 1; p < order.size(); ++p)
        if (!movable.count(order[p])) return order[p];
      return kNoNode;
    };
    for (const auto& [key, chain] : chains)
      for (size_t j = 0; j < chain.size(); ++j) {
        NodeId anchor = kNoNode;
        if (j >= size_t(ahead))
          anchor = first_fixed_after(chain[j - size_t(ahead)]);
        else if (key.first == int(NodePhase::kRecompute))
          anchor = backward_start;
        if (anchor != kNoNode && pos.at(anchor) < pos.at(chain[j]))
          moves.emplace_back(chain[j], anchor);
      }
  }
  for (const auto& [gather, anchor] : moves) {
    std::map<NodeId, size_t> pos;
    for (size_t p = 0; p < order.size(); ++p) pos[order[p]] = p;
    const size_t at = pos.at(anchor);
    std::set<NodeId> moved = {gather};
    for (NodeId n : closure(graph, graph.consumers(), {gather}, true))
      if (pos.at(n) > at) moved.insert(n);
    std::vector<NodeId> next;
    next.reserve(order.size());
    for (size_t p = 0; p < order.size(); ++p) {
      if (p == at)
        for (NodeId n : order)
          if (moved.count(n)) next.push_back(n);
      if (!moved.count(order[p])) next.push_back(order[p]);
    }
    order = std::move(next);
    ++stats.gathers_moved;
  }
  graph.set_schedule(order);
  return stats;
}

}  // namespace meshtrain
