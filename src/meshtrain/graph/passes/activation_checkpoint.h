// Activation checkpointing as a graph pass. Forward nodes are grouped into regions (a
// transformer block: the nodes of one Node::block); inside a region, a node the policy does not
// save is recomputed in backward: it is cloned (phase kRecompute) before the region's first
// backward reader, and backward reads the clone, so the forward value dies after its last forward
// use. Saved nodes keep their outputs. FSDP all_gathers are never cloned here (they stay region
// inputs; the reshard-after-forward pass, run after this one, gathers them again before the
// recompute when resharding). The expert token exchange (ep_counts, ep_to_experts,
// ep_from_experts) is always saved, so a
// recompute never repeats the token exchange or sees other split sizes.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

struct CheckpointStats {
  int regions = 0;
  int nodes_recomputed = 0;
};

// region_of(node): the region key of a forward node ("" = not checkpointed).
// save(node): keep this node's outputs instead of recomputing them.
CheckpointStats checkpoint_regions(Graph& graph,
                                   const std::function<std::string(const Node&)>& region_of,
                                   const std::function<bool(const Node&)>& save);

// The regions for [activation_checkpoint] mode: "full" every block; "selective" with option N:
// every N-th block (full); with option "op": every block under the per-op policy below.
std::function<std::string(const Node&)> block_regions(int every_nth_block);
// Per-op selective policy ("op"): save the outputs of matmuls, attention, grouped expert GEMMs
// and collectives; recompute norms, rope, activations, casts, adds and other cheap ops.
bool selective_op_saves(const Node& node);
// "free": recompute only the nodes "op" would whose every input the backward has anyway (a
// graph input or parameter, a value a backward node reads, or another such recomputed value), so
// the recompute keeps nothing alive that was not already: the saved set only shrinks. On the
// DeepSeek bench model these are the SwiGLU products, the routed-row permutations, the norms and
// the router's casts: most of "op"'s memory saving from a fraction of its nodes. The predicate is
// computed from `graph` as it is now (before checkpoint_regions rewires it).
std::function<bool(const Node&)> free_recompute_saves(const Graph& graph);
// Full recompute: save nothing except what the pass itself always keeps.
bool full_recompute_saves(const Node& node);

}  // namespace meshtrain
