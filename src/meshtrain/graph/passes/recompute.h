// Recompute: the one mechanism behind activation checkpointing, reshard-after-forward and the
// later bucketing/prefetch passes. Forward nodes are cloned (phase kRecompute) for the readers
// outside forward (backward, earlier clones), which then read the clones, so the forward values
// die after their last forward use. Rule: clones are made inputs first, so creation order (ids)
// is a dependency order, and each region's clones run right before its first rewired reader.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

class Recompute {
 public:
  // Snapshots the graph's schedule and consumers: readers are those of the graph as it is now
  // (clones made later are not rewired by later regions). Cloned values are named
  // `<original name><name_suffix>`.
  Recompute(Graph& graph, std::string name_suffix);

  struct Region {
    std::vector<NodeId> clones;  // creation order (inputs before their users)
    NodeId before = kNoNode;     // the first rewired reader in the schedule; kNoNode: no clones
  };

  // One region: for each value in `values` (in order) that has readers outside forward, clones
  // its producer and, depth first, every producer of a clone's inputs for which `clone(node)`
  // holds (a producer it rejects is read as saved), then points those readers at the clone. A
  // value whose producer `clone` rejects is left as is, and so is a reader an earlier region
  // already rewired. View clones alias their input's storage.
  Region add(const std::vector<ValueId>& values, const std::function<bool(const Node&)>& clone);

  // Writes the schedule: the snapshot with every region's clones spliced in right before its
  // first reader (regions sharing a reader in the order they were added). Call once, last.
  void splice();

  int num_clones() const { return num_clones_; }

 private:
  ValueId recomputed(ValueId v, const std::function<bool(const Node&)>& clone,
                     std::map<NodeId, NodeId>& clone_of, Region& region);

  Graph& graph_;
  std::string suffix_;
  std::vector<NodeId> order_;                   // the schedule at construction
  std::vector<int> pos_;                        // per original node: position in order_
  std::vector<std::vector<NodeId>> consumers_;  // per original value
  std::map<NodeId, std::vector<NodeId>> splice_before_;
  int num_clones_ = 0;
};

}  // namespace meshtrain
