// fuse_slice_grads: autodiff turns the forward pattern "slice a tensor into pieces along one dim"
// (MLA's q into q_nope / q_pe, kv into k_nope / v, wkv_a's output into latent / k_pe) into one
// zero-filled slice_backward per piece and a tree of adds. When the pieces tile the dim exactly,
// that sum is a concat of the piece gradients: this pass rewrites the root add into that concat
// (one write of the full tensor instead of a memset and a copy per piece plus an add per pair)
// and kills the slice_backwards and inner adds. Values are identical: every element of the sum
// is one piece's element plus zeros.
#pragma once

#include "meshtrain/ir/ir.h"

namespace meshtrain {

// Returns how many add trees became concats. Run after eliminate_dead_nodes (it relies on the
// consumer lists of live nodes only).
int fuse_slice_grads(Graph& graph);

}  // namespace meshtrain
