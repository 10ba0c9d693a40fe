// Reshard-after-forward (FSDP2's reshard_after_forward, as a graph pass): for every forward
// all_gather the predicate accepts (it reads the node's block), the gathered weight is no longer
// kept from forward to backward. The gather chain (all_gather and the views/casts/slices after it)
// is cloned with phase kRecompute right before its first backward consumer, and backward reads the
// clone. The forward copy then dies after its last forward use, which the memory plan shows.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

struct ReshardStats {
  int gathers_recomputed = 0;
  // Bytes (256-aligned, as the memory plan counts them) of gathered weights no longer held from
  // forward to backward.
  int64_t bytes_released = 0;
};

// `group` is the mesh group of the FSDP gathers (MeshGroup::kFsdp). Sets the graph's schedule.
ReshardStats reshard_after_forward(Graph& graph, MeshGroup group,
                                   const std::function<bool(const Node& gather)>& reshard);

}  // namespace meshtrain
