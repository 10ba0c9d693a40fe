// assign_streams: collectives by group; a fixed order of the common groups keeps stream numbers
// stable across models and runs (traces are easier to compare).
#include "meshtrain/graph/passes/assign_streams.h"

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

std::map<std::string, int> assign_streams(Graph& graph) {
  static const char* kOrder[] = {"fsdp", "tp", "ep", "efsdp", "dp_replicate", "edp",
                                 "etp",  "cp", "dp", "loss",  "world"};
  std::map<std::string, int> stream_of;
  int next = 1;
  for (const char* g : kOrder) stream_of[g] = next++;
  std::map<std::string, int> used;
  const OpRegistry& reg = OpRegistry::instance();
  for (Node& n : graph.nodes()) {
    if (n.dead || !reg.op(n.op).collective) continue;
    std::string group = n.attrs.s("group", "");
    auto it = stream_of.find(group);
    if (it == stream_of.end()) it = stream_of.emplace(group, next++).first;
    n.stream = it->second;
    used[group] = it->second;
  }
  return used;
}

}  // namespace meshtrain
