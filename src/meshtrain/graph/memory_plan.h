// Liveness-based memory plan, computed once before the first step. Every activation and every
// node workspace gets a fixed offset in one arena (greedy best-fit by size over live ranges);
// inputs get their own region; persistent values (parameters and their compute copies, gradients,
// optimizer and other state) are counted here but owned by their stores. Views share their root
// value's bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/device.h"
#include "meshtrain/ir/ir.h"

namespace meshtrain {

enum class MemRegion : uint8_t { kNone, kArena, kInput, kPersistent };

struct ArenaBlock {
  int64_t offset = 0;
  int64_t bytes = 0;
  int first = 0;  // schedule positions [first, last] during which the block is live
  int last = 0;
  ValueId value = kNoValue;  // kNoValue for a node workspace
  NodeId node = kNoNode;     // the workspace's node
};

struct MemoryPlan {
  static constexpr int64_t kAlignment = 256;
  std::vector<NodeId> schedule;
  std::vector<MemRegion> region;          // per value
  std::vector<int64_t> offset;            // per value: byte offset in its region (roots and views)
  std::vector<int64_t> workspace_offset;  // per node: arena offset of its scratch (-1: none)
  std::vector<int64_t> workspace_bytes;   // per node
  std::vector<ArenaBlock> blocks;         // every arena allocation, for hazard analysis
  int64_t arena_bytes = 0;                // peak of the activation arena
  int64_t input_bytes = 0;
  int64_t parameter_bytes = 0;  // persistent, by role
  int64_t gradient_bytes = 0;
  int64_t state_bytes = 0;
  // Mixed precision: the persistent compute-dtype copies of the masters (ValueRole::kComputeCopy)
  // the forward reads instead of casting each master every micro-batch.
  int64_t compute_copy_bytes = 0;
  int64_t total_bytes() const {
    return arena_bytes + input_bytes + parameter_bytes + compute_copy_bytes + gradient_bytes +
           state_bytes;
  }
  // Sum of live activation bytes at the busiest schedule position (a lower bound on arena_bytes;
  // their ratio shows fragmentation).
  int64_t live_peak_bytes = 0;
  int live_peak_position = 0;  // the schedule position where it is reached (the first such)
  std::string summary() const;
};

// Root value whose storage a value uses (itself unless it is a view).
ValueId storage_root(const Graph& graph, ValueId v);

// Node workspaces are sized by the kernels registered for `device` (ValueError for a scheduled op
// without one: such a graph could not run there either).
MemoryPlan plan_memory(const Graph& graph, DeviceType device);

}  // namespace meshtrain
