// Bucketing (SimpleFSDP's bucketing pass, on the step graph): the per-parameter FSDP all-gathers
// and gradient reduce-scatters (and the gradient all-reduces of HSDP's replicas, DDP and TP) are
// merged into one collective per bucket over a flat buffer. A
// bucket is one transformer block's collectives of one kind, phase, mesh group and dtype (or, by
// size, consecutive ones up to a byte cap), so expert and dense parameters, which live on other
// mesh groups, never share one. The bucketed node runs where its first gather (or last
// reduce-scatter) ran; the producers its gathers need move up with it, the consumers of its
// reduce-scatters down. Results are those of the single collectives, bit for bit on a
// communicator whose reduction order does not depend on the buffer (see comm/mpi).
#pragma once

#include <cstdint>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

enum class BucketMode : uint8_t {
  kNone,              // one collective per parameter
  kTransformerBlock,  // one bucket per block ("layers.N"); the root parameters between blocks
  kSize,              // consecutive collectives of one kind up to `bucket_bytes`
};

struct BucketOptions {
  BucketMode mode = BucketMode::kTransformerBlock;
  int64_t bucket_bytes = 0;  // kSize: a bucket closes once it holds this many bytes (or more)
};

struct BucketStats {
  int collectives_before = 0;  // the parameter collectives the pass considered
  int collectives_after = 0;   // what they became (buckets and collectives left alone)
  int buckets = 0;             // bucketed nodes of two or more tensors
};

// Which collectives are bucketed (by op properties and the graph, never by names): all-gathers
// whose input is computed from persistent values only (parameter shards, through casts), and
// reduce-scatters whose output only flows (through casts, views and HSDP's replica all-reduces)
// into side-effect sinks (the gradient accumulators), and backward all-reduces whose output
// does the same (HSDP/DDP replica sums, TP sums of replicated parameters' gradients; bucketed
// apart from the reduce-scatters that feed them, one bucket per block, group and dtype).
// Activation collectives (TP, the token exchange) are left alone (one per tensor).
// Writes the graph's schedule.
BucketStats bucket_collectives(Graph& graph, const BucketOptions& options);

struct PrefetchStats {
  int gathers_moved = 0;  // parameter gathers issued earlier than their bucket's first use
};

// Prefetch (run after bucketing): each parameter all-gather of the forward and of the backward's
// re-gathers (phase kRecompute) is issued `max_gathered_blocks - 1` gathers ahead on its mesh
// group: right after the gather that many places before it in that group's order (its producers,
// parameter casts, move with it), so block i+1's weights travel on the group's stream while block
// i computes. The first ones of the backward go to the start of the backward. Reduce-scatters
// need no move: a bucket runs right after its block's last gradient, so block i's reduce-scatter
// overlaps block i-1's backward on its own stream. max_gathered_blocks = 1 changes nothing. The
// memory plan then holds the prefetched weights longer; `meshtrain plan` prints the difference.
PrefetchStats prefetch_gathers(Graph& graph, int max_gathered_blocks);

}  // namespace meshtrain
