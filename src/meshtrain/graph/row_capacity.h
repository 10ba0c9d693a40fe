// Data-sized row buffers: the local side of the expert-parallel exchange, whose rows are the
// tokens that other ranks route to this rank's experts. The memory plan reserves them at the
// planned capacity (expected load × capacity factor). A capacity source (ep_counts) learns at its
// host sync point how many rows this step needs and calls fit(rows): within the plan nothing
// changes; beyond it, every value that follows the source (found at prepare by running shape
// inference with more rows) and the scratch that grows with them are rebound to a pool of their
// own, grown when a step needs more than it holds. Those growths are the only allocations after
// prepare, and only steps that overflow make them; the run stays dropless. Rule: the values that
// follow a source are all produced after it, so rebinding them never moves live data.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

// What the pools saw since the executor was prepared (summed over every capacity source).
struct RowCapacityStats {
  int64_t fits = 0;        // calls: one per MoE layer per micro-batch forward
  int64_t overflows = 0;   // calls that needed more rows than planned
  int64_t grows = 0;       // pool (re)allocations
  int64_t pool_bytes = 0;  // bytes the pools hold now
  double max_fill = 0;     // most rows needed / planned rows
};

// One capacity source's followers and their pool. Made by RowCapacityPools::build.
class RowCapacityGroup;

class RowCapacityPools {
 public:
  // A binding site: where a node's context holds a tensor (kIn/kOut slot i, or its workspace).
  struct Site {
    KernelContext* ctx;
    enum Kind { kIn, kOut, kWorkspace } kind;
    int slot;
  };
  // Finds every capacity source of `graph` and its followers. `contexts[p]` is the context of
  // schedule position p (the executor's; it must outlive this object).
  RowCapacityPools(const Graph& graph, const MemoryPlan& plan, Backend& backend,
                   std::vector<KernelContext*> contexts);
  ~RowCapacityPools();
  RowCapacityStats stats() const;
  bool empty() const { return groups_.empty(); }

 private:
  std::vector<std::unique_ptr<RowCapacityGroup>> groups_;
};

}  // namespace meshtrain
