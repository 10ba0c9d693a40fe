// Expert-parallel token exchange as graph ops, inserted between moe_permute (alignment 1, so the
// rows bound for each EP rank — a contiguous block of experts — are contiguous) and the expert
// GEMMs. Three ops over the `ep` group:
//   ep_counts:       every rank sends each peer its counts for that peer's experts; returns the
//                    received counts [ep, E_local] and the groups [2, E_local] of the local
//                    expert-major buffer (padded to `alignment`). Not differentiable.
//   ep_to_experts:   rows to the ranks owning their experts, regrouped by local expert.
//   ep_from_experts: the reverse exchange, back into the sender's expert-major order.
// The last two are linear maps and each other's adjoint, so each is the other's backward; no
// count exchange happens in backward or in a recomputation (activation checkpointing keeps these
// ops' outputs: the token exchange is saved, never repeated).
//
// Host reads: NCCL and MPI take per-peer row counts on the host. ep_counts copies its (small)
// count tensors into pinned host buffers made at prepare time and waits for them: the one host
// wait of a MoE layer per micro-batch (in counts_kernel). The exchanges, their backward and the
// grouped GEMMs then read those host copies without copying or waiting again.
//
// Memory: the local expert-major buffer is planned for the expected load with headroom
// (capacity factor × the rows this rank routes, which is what it receives when routing is
// balanced), not for the worst case (every row of every peer), which would grow expert
// activations with EP. A micro-batch that needs more rows stays dropless: ep_counts, at its host
// sync point, moves the buffers that follow it to a pool grown for that step
// (graph/row_capacity.h); the trainer logs how often that happened.
//
// Padded ([parallelism] expert_exchange = "padded", moe/padded_exchange.h): the same three ops with
// no host wait. Blocks per peer and slots per local expert have sizes fixed on the host, the
// counts stay on the device, and the local buffer is El slots of slot_rows rows. A micro-batch
// whose rows do not fit is counted on the device; the trainer redoes that step synced.
#pragma once

#include <string>

#include "meshtrain/ir/builder.h"
#include "meshtrain/moe/padded_exchange.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ops {

struct EpLayout {
  ValueId recv_counts;   // [ep, E_local] int32: rows this rank receives per (peer, local expert)
  ValueId local_groups;  // [2, E_local] int32: start row / count of each local expert
  int64_t local_capacity = 0;  // planned rows of the local expert-major buffer
  int64_t block_rows = 0;      // > 0: the graph may exchange padded (rows per peer block)
};

// The padded exchange's sizes for `choices` rows routed by each rank: a peer block holds
// capacity_factor × its share (choices / ep), a slot capacity_factor × an expert's share of what
// the rank receives (choices / local_experts), padded to `alignment`.
EpPaddedShape ep_padded_shape(int ep, int64_t choices, int64_t local_experts, int64_t alignment,
                              double capacity_factor);

// The padded exchanges of `graph` (every MoE layer) run synced while `synced` is set: the
// trainer's replay of a step whose padded exchange overflowed. No effect on other graphs.
void set_ep_exchange_synced(const Graph& graph, bool synced);
// float32 [1] on the device: blocks and slots of `graph`'s padded exchanges that held more rows
// than planned since the caller last zeroed it; undefined when the graph has none prepared.
Tensor ep_overflow_counter(const Graph& graph);

// Planned rows of the local buffer: `choices` × capacity_factor rows padded over the local
// experts, at most the worst case (ep × choices padded).
int64_t ep_local_capacity(int ep, int64_t choices, int64_t local_experts, int64_t alignment,
                          double capacity_factor);

// groups [2, E] int32 from moe_dispatch_plan with alignment 1 over `choices` routed rows; `ep`
// ranks in `group`. The local buffer is planned at ep_local_capacity, or at the padded slots.
EpLayout ep_counts(Builder& b, ValueId groups, MeshGroup group, int ep, int64_t alignment,
                   int64_t choices, double capacity_factor, bool padded = false);
ValueId ep_to_experts(Builder& b, ValueId x_perm, ValueId groups, const EpLayout& layout,
                      MeshGroup group);
ValueId ep_from_experts(Builder& b, ValueId y_local, ValueId groups, const EpLayout& layout,
                        int64_t capacity, MeshGroup group);

}  // namespace meshtrain::ops
