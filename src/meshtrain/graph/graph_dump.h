// The scheduled graph as text (`meshtrain plan --dump-graph`, `[job] dump_graph`): per graph a
// summary (nodes per phase, memory, streams, collectives per kind and mesh group with their bytes),
// then one line per node in schedule order: position, phase (recomputed nodes marked `*`),
// stream, op, each output's dtype, shape and memory-plan place, the workspace, the collective's
// group and bytes, and the scope. Reads the graph and its plan; changes nothing.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ir/ir.h"

namespace meshtrain {

// Bytes a collective node moves, by the size of its full buffer: the gathered output of an
// all_gather, the input of a reduce_scatter, the tensor of an all_reduce, and for the token
// exchange the capacity-bounded buffer (an upper bound: the rows sent depend on the routing).
// 0 for other nodes.
int64_t collective_bytes(const Graph& graph, const Node& node);

struct GraphSection {
  std::string title;  // "step graph (one micro-batch)", "optimizer graph"
  const Graph* graph = nullptr;
  const MemoryPlan* plan = nullptr;
};

// The sections one after the other, each with its summary first.
std::string dump_graphs(const std::vector<GraphSection>& sections);

// "12.0 KiB"-style sizes.
std::string human_bytes(int64_t bytes);

}  // namespace meshtrain
