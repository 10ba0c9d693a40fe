// Memory planning: live ranges on the schedule, then greedy placement of blocks, largest first,
// at the lowest offset that overlaps no block whose live range intersects.
#include "meshtrain/graph/memory_plan.h"

#include <algorithm>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {
namespace {
int64_t align_up(int64_t x) {
  return (x + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
}

std::string gib(int64_t b) { return fmt::format("{:.3f} GiB", double(b) / (1024.0 * 1024 * 1024)); }

void place_blocks(std::vector<ArenaBlock>& blocks, int64_t& arena_bytes) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (blocks[a].bytes != blocks[b].bytes) return blocks[a].bytes > blocks[b].bytes;
    return blocks[a].first < blocks[b].first;
  });
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of time-overlapping blocks
  arena_bytes = 0;
  for (size_t idx : order) {
    ArenaBlock& blk = blocks[idx];
    busy.clear();
    for (size_t p : placed) {
      const ArenaBlock& o = blocks[p];
      if (o.first <= blk.last && blk.first <= o.last)
        busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    int64_t candidate = 0;
    for (auto [b, e] : busy) {
      if (candidate + blk.bytes <= b) break;
      candidate = std::max(candidate, align_up(e));
    }
    blk.offset = candidate;
    arena_bytes = std::max(arena_bytes, candidate + blk.bytes);
    placed.push_back(idx);
  }
}
}  // namespace

ValueId storage_root(const Graph& graph, ValueId v) {
  const Value& val = graph.value(v);
  return val.alias_of == kNoValue ? v : val.alias_of;
}

MemoryPlan plan_memory(const Graph& graph, DeviceType device) {
  const OpRegistry& reg = OpRegistry::instance();
  MemoryPlan plan;
  plan.schedule = graph.schedule();
  const int nv = graph.num_values();
  const int steps = int(plan.schedule.size());
  plan.region.assign(size_t(nv), MemRegion::kNone);
  plan.offset.assign(size_t(nv), -1);
  plan.workspace_offset.assign(size_t(graph.num_nodes()), -1);
  plan.workspace_bytes.assign(size_t(graph.num_nodes()), 0);

  // Live ranges of storage roots, over schedule positions.
  std::vector<int> first(size_t(nv), -1), last(size_t(nv), -1);
  std::vector<char> used(size_t(nv), 0);
  for (int pos = 0; pos < steps; ++pos) {
    const Node& n = graph.node(plan.schedule[size_t(pos)]);
    for (ValueId out : n.outputs) {
      ValueId r = storage_root(graph, out);
      used[r] = 1;
      if (first[r] < 0) first[r] = pos;
      last[r] = std::max(last[r], pos);
    }
    for (ValueId in : n.inputs) {
      ValueId r = storage_root(graph, in);
      used[r] = 1;
      if (first[r] < 0) first[r] = pos;
      last[r] = std::max(last[r], pos);
    }
  }
  for (ValueId out : graph.outputs()) {
    ValueId r = storage_root(graph, out);
    used[r] = 1;
    if (first[r] < 0) first[r] = 0;
    last[r] = steps;  // read by the host after the run
  }

  for (ValueId v = 0; v < nv; ++v) {
    const Value& val = graph.value(v);
    if (val.alias_of != kNoValue) continue;
    int64_t bytes = int64_t(val.meta.nbytes());
    switch (val.role) {
      case ValueRole::kParameter:
        plan.parameter_bytes += bytes;
        plan.region[v] = MemRegion::kPersistent;
        break;
      case ValueRole::kGradient:
        plan.gradient_bytes += bytes;
        plan.region[v] = MemRegion::kPersistent;
        break;
      case ValueRole::kState:
        plan.state_bytes += bytes;
        plan.region[v] = MemRegion::kPersistent;
        break;
      case ValueRole::kComputeCopy:
        plan.compute_copy_bytes += bytes;
        plan.region[v] = MemRegion::kPersistent;
        break;
      case ValueRole::kInput:
        plan.region[v] = MemRegion::kInput;
        plan.offset[v] = plan.input_bytes;
        plan.input_bytes += align_up(bytes);
        break;
      case ValueRole::kActivation:
        if (!used[v]) break;
        plan.region[v] = MemRegion::kArena;
        plan.blocks.push_back(ArenaBlock{0,
                                         std::max<int64_t>(align_up(bytes), MemoryPlan::kAlignment),
                                         first[v], last[v], v, kNoNode});
        break;
    }
  }

  for (int pos = 0; pos < steps; ++pos) {
    const Node& n = graph.node(plan.schedule[size_t(pos)]);
    // The scratch of the kernel this node will run on `device` (its registration sizes it).
    const int64_t bytes = int64_t(reg.workspace_bytes(n, graph, device));
    if (bytes <= 0) continue;
    plan.workspace_bytes[size_t(n.id)] = bytes;
    plan.blocks.push_back(ArenaBlock{0, align_up(bytes), pos, pos, kNoValue, n.id});
  }

  // Peak of simultaneously live bytes (the fragmentation-free lower bound).
  std::vector<int64_t> delta(size_t(steps + 2), 0);
  for (const ArenaBlock& b : plan.blocks) {
    delta[size_t(b.first)] += b.bytes;
    delta[size_t(b.last + 1)] -= b.bytes;
  }
  int64_t live = 0;
  for (int pos = 0; pos < steps; ++pos)
    if ((live += delta[size_t(pos)]) > plan.live_peak_bytes) {
      plan.live_peak_bytes = live;
      plan.live_peak_position = pos;
    }

  place_blocks(plan.blocks, plan.arena_bytes);
  for (const ArenaBlock& b : plan.blocks) {
    if (b.value != kNoValue)
      plan.offset[b.value] = b.offset;
    else
      plan.workspace_offset[size_t(b.node)] = b.offset;
  }
  for (ValueId v = 0; v < nv; ++v) {
    const Value& val = graph.value(v);
    if (val.alias_of == kNoValue) continue;
    plan.region[v] = plan.region[val.alias_of];
    plan.offset[v] = plan.offset[val.alias_of];
  }
  return plan;
}

std::string MemoryPlan::summary() const {
  // The compute copies are named only where they exist (mixed precision), so float32 runs keep
  // their line.
  const std::string copies =
      compute_copy_bytes > 0 ? fmt::format(" + compute copies {}", gib(compute_copy_bytes)) : "";
  return fmt::format(
      "parameters {}{}, gradients {}, other state {}, activations {} (live peak {}), inputs "
      "{}; total {}",
      gib(parameter_bytes), copies, gib(gradient_bytes), gib(state_bytes), gib(arena_bytes),
      gib(live_peak_bytes), gib(input_bytes), gib(total_bytes()));
}

}  // namespace meshtrain
