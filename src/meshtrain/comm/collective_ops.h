// Differentiable collectives as graph ops. Each names the mesh group it runs over; the kernel
// finds the Communicator through ExecServices, so the same node runs on MPI or NCCL. Autodiff
// derives the backward from each op's rule: all_gather ↔ reduce_scatter, and all_reduce's
// backward is chosen by the placement it implements (see AllReduceGrad).
#pragma once

#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// [n, ...] on each of k ranks -> [k·n, ...] (rank blocks in rank order).
ValueId all_gather(Builder& b, ValueId x, MeshGroup group, int group_size);
// [k·n, ...] -> [n, ...]: block r of the sum over ranks, on rank r.
ValueId reduce_scatter(Builder& b, ValueId x, MeshGroup group, int group_size);

enum class AllReduceGrad : uint8_t {
  kIdentity,  // Partial -> Replicate feeding replicated compute (Megatron's g): grad passes through
  kAllReduce,  // the sum feeds per-rank losses that are all counted (grads are summed back)
  kNone,       // not differentiated (optimizer graph, metrics)
};
ValueId all_reduce(Builder& b, ValueId x, MeshGroup group, ReduceOp op = ReduceOp::kSum,
                   AllReduceGrad grad = AllReduceGrad::kNone);
// Identity forward, sum over `group` in backward: a parameter replicated across the group whose
// per-rank gradients must be added (DDP / the replicate dim of HSDP; Megatron's f).
ValueId replicate_grad(Builder& b, ValueId x, MeshGroup group);

}  // namespace meshtrain::ops
