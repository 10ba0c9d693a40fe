// Recompute: depth-first cloning, alias fixing, reader rewiring and the schedule splice.
#include "meshtrain/graph/passes/recompute.h"

#include <algorithm>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

Recompute::Recompute(Graph& graph, std::string name_suffix)
    : graph_(graph),
      suffix_(std::move(name_suffix)),
      order_(graph.schedule()),
      pos_(size_t(graph.num_nodes()), -1),
      consumers_(graph.consumers()) {
  for (size_t i = 0; i < order_.size(); ++i) pos_[size_t(order_[i])] = int(i);
}

ValueId Recompute::recomputed(ValueId v, const std::function<bool(const Node&)>& clone,
                              std::map<NodeId, NodeId>& clone_of, Region& region) {
  const NodeId prod = graph_.value(v).producer;
  if (prod == kNoNode || !clone(graph_.node(prod))) return v;
  auto it = clone_of.find(prod);
  if (it == clone_of.end()) {
    const Node src = graph_.node(prod);  // a copy: add_node may move the node array
    std::vector<ValueId> ins;
    for (ValueId in : src.inputs) ins.push_back(recomputed(in, clone, clone_of, region));
    std::vector<TensorMeta> metas;
    for (ValueId o : src.outputs) metas.push_back(graph_.value(o).meta);
    const NodeId cid =
        graph_.add_node(src.op, ins, metas, src.attrs, src.scope, src.block, NodePhase::kRecompute);
    const OpDef& def = OpRegistry::instance().op(src.op);
    for (size_t k = 0; k < src.outputs.size(); ++k) {
      const ValueId out = graph_.node(cid).outputs[k];
      graph_.value(out).name = graph_.value(src.outputs[k]).name + suffix_;
      if (k == 0 && def.view_of_input >= 0) {
        const ValueId in = ins[size_t(def.view_of_input)];
        const Value& iv = graph_.value(in);
        graph_.value(out).alias_of = iv.alias_of != kNoValue ? iv.alias_of : in;
      }
    }
    it = clone_of.emplace(prod, cid).first;
    region.clones.push_back(cid);
  }
  const Node& src = graph_.node(prod);
  const size_t k =
      size_t(std::find(src.outputs.begin(), src.outputs.end(), v) - src.outputs.begin());
  return graph_.node(it->second).outputs[k];
}

Recompute::Region Recompute::add(const std::vector<ValueId>& values,
                                 const std::function<bool(const Node&)>& clone) {
  Region region;
  std::map<NodeId, NodeId> clone_of;  // original -> clone, within this region
  for (ValueId v : values) {
    if (size_t(v) >= consumers_.size()) continue;  // made after the snapshot: no readers
    for (NodeId reader : consumers_[size_t(v)]) {
      const Node& rn = graph_.node(reader);
      if (rn.phase == NodePhase::kForward) continue;
      // An earlier region may have pointed this reader at a clone already.
      if (std::find(rn.inputs.begin(), rn.inputs.end(), v) == rn.inputs.end()) continue;
      const ValueId repl = recomputed(v, clone, clone_of, region);
      if (repl == v) continue;
      for (ValueId& in : graph_.node(reader).inputs)
        if (in == v) in = repl;
      if (region.before == kNoNode || pos_[size_t(reader)] < pos_[size_t(region.before)])
        region.before = reader;
    }
  }
  if (!region.clones.empty()) {
    auto& slot = splice_before_[region.before];
    slot.insert(slot.end(), region.clones.begin(), region.clones.end());
    num_clones_ += int(region.clones.size());
  }
  return region;
}

void Recompute::splice() {
  std::vector<NodeId> schedule;
  schedule.reserve(order_.size() + size_t(num_clones_));
  for (NodeId id : order_) {
    auto it = splice_before_.find(id);
    if (it != splice_before_.end())
      schedule.insert(schedule.end(), it->second.begin(), it->second.end());
    schedule.push_back(id);
  }
  graph_.set_schedule(std::move(schedule));
}

}  // namespace meshtrain
