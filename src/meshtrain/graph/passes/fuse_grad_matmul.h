// fuse_grad_matmul: under mixed precision a weight's gradient is a bf16 matmul (dW = dYᵀ X) that
// the gradient sink then widens and adds into the parameter's fp32 gradient buffer: one more
// pass over memory per weight and a bf16 rounding of every gradient element. This pass rewrites
// each such sink into the matmul's accumulating form (matmul_accumulate: the GEMM writes the fp32
// buffer itself, beta 0 for the first micro-batch and 1 after), and kills the matmul.
#pragma once

#include "meshtrain/ir/ir.h"

namespace meshtrain {

// Rewrites every sink (OpDef::accumulates_in_place) whose float32 destination receives a bf16
// value produced, through views only, by a single-use op with an accumulating form
// (OpDef::accumulating_form). Same-dtype sinks are left alone (nothing to save but the add, and
// the float32/float64 runs keep their arithmetic bit for bit). A rewritten sink that is its
// buffer's only writer is scheduled where its producer was (sets the graph's schedule), so the
// GEMM's inputs die at their last use inside the backward instead of living to its end, where the
// sinks were appended. Returns how many it rewrote. Run after eliminate_dead_nodes (it relies on
// the consumer lists of live nodes only) and before the passes that set a schedule.
int fuse_grad_matmul(Graph& graph);

}  // namespace meshtrain
