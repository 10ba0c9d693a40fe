// Differentiable collectives as graph ops. Each names the mesh group it runs over; the kernel
// finds the Communicator through ExecServices, so the same node runs on MPI or NCCL. Autodiff
// derives the backward from each op's rule: all_gather ↔ reduce_scatter, and all_reduce's
// backward is chosen by the placement it implements (see AllReduceGrad). all_gather,
// reduce_scatter and all_reduce also take N tensors (a bucket, made by
// graph/passes/bucket_collectives): one collective over a flat buffer in the node's workspace, bit
// for bit the N single ones where the communicator reduces element by element in rank order.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/ir/builder.h"

namespace meshtrain {

// Flat buffers of bucketed collectives: a bucket of N tensors travels as one buffer of `ranks`
// blocks, each block holding every tensor's slice for that rank back to back (tensor i at byte
// offset offset[i] of each block). Packing and unpacking are byte copies on the collective's
// stream, so a bucketed collective moves exactly the bytes of the per-tensor ones.
struct BucketLayout {
  std::vector<size_t> offset;  // byte offset of tensor i inside one rank block
  std::vector<size_t> bytes;   // bytes of tensor i inside one rank block
  size_t block_bytes = 0;      // one rank block: the sum of `bytes`
};

// `block_bytes[i]`: bytes of tensor i in one rank block.
BucketLayout bucket_layout(const std::vector<size_t>& block_bytes);

// Rank blocks: tensor i holds `ranks` consecutive blocks of layout.bytes[i] each (ranks = 1: the
// whole tensor is one block). pack copies block r of tensor i to flat + r·block_bytes +
// offset[i]; unpack is the inverse.
void pack_rank_blocks(Backend& be, Stream& s, const std::vector<Tensor>& tensors, void* flat,
                      const BucketLayout& layout, int ranks);
void unpack_rank_blocks(Backend& be, Stream& s, const void* flat,
                        const std::vector<Tensor>& tensors, const BucketLayout& layout, int ranks);

}  // namespace meshtrain

namespace meshtrain::ops {

// [n, ...] on each of k ranks -> [k·n, ...] (rank blocks in rank order).
ValueId all_gather(Builder& b, ValueId x, MeshGroup group, int group_size);
// [k·n, ...] -> [n, ...]: block r of the sum over ranks, on rank r.
ValueId reduce_scatter(Builder& b, ValueId x, MeshGroup group, int group_size);
// Bucketed forms: one node, N inputs, N outputs (each as the single op would give).
std::vector<ValueId> all_gather_bucket(Builder& b, const std::vector<ValueId>& xs, MeshGroup group,
                                       int group_size);
std::vector<ValueId> reduce_scatter_bucket(Builder& b, const std::vector<ValueId>& xs,
                                           MeshGroup group, int group_size);

enum class AllReduceGrad : uint8_t {
  kIdentity,  // Partial -> Replicate feeding replicated compute (Megatron's g): grad passes through
  kAllReduce,  // the sum feeds per-rank losses that are all counted (grads are summed back)
  kNone,       // not differentiated (optimizer graph, metrics)
};
ValueId all_reduce(Builder& b, ValueId x, MeshGroup group, ReduceOp op = ReduceOp::kSum,
                   AllReduceGrad grad = AllReduceGrad::kNone);
// Bucketed form (HSDP/DDP replicate gradients, made by the bucketing pass): one node, N inputs of
// one dtype, one all-reduce over their flat buffer.
std::vector<ValueId> all_reduce_bucket(Builder& b, const std::vector<ValueId>& xs, MeshGroup group,
                                       ReduceOp op = ReduceOp::kSum,
                                       AllReduceGrad grad = AllReduceGrad::kNone);
// Identity forward, sum over `group` in backward: a parameter replicated across the group whose
// per-rank gradients must be added (DDP / the replicate dim of HSDP; Megatron's f).
ValueId replicate_grad(Builder& b, ValueId x, MeshGroup group);

}  // namespace meshtrain::ops
