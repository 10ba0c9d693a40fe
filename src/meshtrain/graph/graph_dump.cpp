// Graph dump: the summary tables and the node lines.
#include "meshtrain/graph/graph_dump.h"

#include <map>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {
namespace {

std::string value_text(const Graph& g, const MemoryPlan& mp, ValueId v) {
  const Value& val = g.value(v);
  std::string place;
  if (val.alias_of != kNoValue) {
    place = fmt::format("view of %{}", val.alias_of);
  } else {
    switch (mp.region[size_t(v)]) {
      case MemRegion::kArena:
        place = fmt::format("arena@{}+{}", mp.offset[size_t(v)],
                            human_bytes(int64_t(val.meta.nbytes())));
        break;
      case MemRegion::kInput:
        place = fmt::format("input@{}+{}", mp.offset[size_t(v)],
                            human_bytes(int64_t(val.meta.nbytes())));
        break;
      case MemRegion::kPersistent: place = value_role_name(val.role); break;
      case MemRegion::kNone: place = "unplaced"; break;
    }
  }
  return fmt::format("%{} {}{} {}", v, dtype_name(val.meta.dtype), val.meta.shape, place);
}

struct Summary {
  std::map<NodePhase, int> nodes;
  // (kind, group) -> count, bytes
  std::map<std::pair<Collective, MeshGroup>, std::pair<int, int64_t>> collectives;
  std::map<int, std::string> streams;  // stream -> what runs on it
};

Summary summarize(const Graph& g, const MemoryPlan& mp) {
  const OpRegistry& reg = OpRegistry::instance();
  Summary s;
  s.streams[0] = "compute";
  for (NodeId id : mp.schedule) {
    const Node& n = g.node(id);
    ++s.nodes[n.phase];
    const OpDef& def = reg.op(n.op);
    if (!def.is_collective()) continue;
    auto& [count, bytes] = s.collectives[{def.collective, n.attrs.group()}];
    ++count;
    bytes += collective_bytes(g, n);
    if (n.stream != 0) s.streams[n.stream] = mesh_group_name(n.attrs.group());
  }
  return s;
}

std::string summary_text(const GraphSection& sec) {
  const Graph& g = *sec.graph;
  const MemoryPlan& mp = *sec.plan;
  const Summary s = summarize(g, mp);
  std::vector<std::string> phases;
  for (auto [phase, n] : s.nodes) phases.push_back(fmt::format("{} {}", node_phase_name(phase), n));
  std::string out = fmt::format("== {}: {} nodes scheduled ({}), {} values\n", sec.title,
                                mp.schedule.size(), fmt::join(phases, ", "), g.num_values());
  const std::string copies =
      mp.compute_copy_bytes > 0
          ? fmt::format(", compute copies {}", human_bytes(mp.compute_copy_bytes))
          : "";
  out += fmt::format(
      "memory: arena {} (live peak {}), inputs {}; persistent: parameters {}{}, gradients {}, "
      "state {}\n",
      human_bytes(mp.arena_bytes), human_bytes(mp.live_peak_bytes), human_bytes(mp.input_bytes),
      human_bytes(mp.parameter_bytes), copies, human_bytes(mp.gradient_bytes),
      human_bytes(mp.state_bytes));
  std::vector<std::string> streams;
  for (const auto& [st, what] : s.streams) streams.push_back(fmt::format("s{} {}", st, what));
  out += fmt::format("streams: {}\n", fmt::join(streams, ", "));
  int total = 0;
  int64_t total_bytes = 0;
  out += "collectives (kind, mesh group, count, bytes; exchange bytes are the capacity bound):\n";
  for (const auto& [key, cb] : s.collectives) {
    out += fmt::format("  {:<15} {:<13} {:>5} {:>12}\n", collective_name(key.first),
                       mesh_group_name(key.second), cb.first, human_bytes(cb.second));
    total += cb.first;
    total_bytes += cb.second;
  }
  std::map<Collective, int> per_kind;
  for (const auto& [key, cb] : s.collectives) per_kind[key.first] += cb.first;
  std::vector<std::string> kinds;
  for (Collective c : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce,
                       Collective::kExchange})
    kinds.push_back(fmt::format("{} {}", per_kind[c], collective_name(c)));
  out += fmt::format("summary: {} collectives ({}), {}\n", total, fmt::join(kinds, ", "),
                     human_bytes(total_bytes));
  return out;
}

std::string node_line(const Graph& g, const MemoryPlan& mp, int pos, NodeId id) {
  const Node& n = g.node(id);
  const OpDef& def = OpRegistry::instance().op(n.op);
  std::vector<std::string> outs;
  for (ValueId v : n.outputs) outs.push_back(value_text(g, mp, v));
  std::string line = fmt::format("{:>5} {}{:<9} s{:<2} {:<22} {}", pos,
                                 n.phase == NodePhase::kRecompute ? "*" : " ",
                                 node_phase_name(n.phase), n.stream, n.op, fmt::join(outs, ", "));
  if (mp.workspace_bytes[size_t(id)] > 0)
    line += fmt::format(" | ws arena@{}+{}", mp.workspace_offset[size_t(id)],
                        human_bytes(mp.workspace_bytes[size_t(id)]));
  if (def.is_collective())
    line += fmt::format(" | {} {} {}", collective_name(def.collective), n.attrs.group(),
                        human_bytes(collective_bytes(g, n)));
  if (!n.scope.empty()) line += " | " + n.scope;
  return line + "\n";
}

}  // namespace

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

int64_t collective_bytes(const Graph& g, const Node& n) {
  // A bucketed collective moves the sum of its tensors.
  auto bytes = [&](const std::vector<ValueId>& vs) {
    int64_t b = 0;
    for (ValueId v : vs) b += int64_t(g.value(v).meta.nbytes());
    return b;
  };
  switch (OpRegistry::instance().op(n.op).collective) {
    case Collective::kNone: return 0;
    case Collective::kAllGather: return bytes(n.outputs);
    case Collective::kReduceScatter:
    case Collective::kAllReduce: return bytes(n.inputs);
    case Collective::kExchange: return std::max(bytes({n.inputs.at(0)}), bytes({n.outputs.at(0)}));
  }
  return 0;
}

std::string dump_graphs(const std::vector<GraphSection>& sections) {
  std::string out;
  for (const GraphSection& sec : sections) {
    if (!out.empty()) out += "\n";
    out += summary_text(sec);
    out +=
        "  pos  phase     stream op                     outputs (dtype[shape] place) | "
        "workspace | collective group bytes | scope\n";
    const MemoryPlan& mp = *sec.plan;
    for (size_t p = 0; p < mp.schedule.size(); ++p)
      out += node_line(*sec.graph, mp, int(p), mp.schedule[p]);
  }
  return out;
}

}  // namespace meshtrain
