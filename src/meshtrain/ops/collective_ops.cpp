// Collective op definitions and their kernels (one kernel for every backend: the Communicator
// of the group does the device-specific work on the node's stream).
#include "meshtrain/ops/collective_ops.h"

namespace meshtrain {

BucketLayout bucket_layout(const std::vector<size_t>& block_bytes) {
  BucketLayout l;
  for (size_t b : block_bytes) {
    l.offset.push_back(l.block_bytes);
    l.bytes.push_back(b);
    l.block_bytes += b;
  }
  return l;
}

namespace {
void check_tensors(const std::vector<Tensor>& tensors, const BucketLayout& layout, int ranks,
                   const char* what) {
  MT_CHECK(tensors.size() == layout.bytes.size(), "{}: {} tensors for a bucket layout of {}", what,
           tensors.size(), layout.bytes.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    MT_CHECK(tensors[i].nbytes() == layout.bytes[i] * size_t(ranks),
             "{}: tensor {} holds {} bytes, the layout expects {} ranks × {} bytes", what, i,
             tensors[i].nbytes(), ranks, layout.bytes[i]);
}
}  // namespace

void pack_rank_blocks(Backend& be, Stream& s, const std::vector<Tensor>& tensors, void* flat,
                      const BucketLayout& layout, int ranks) {
  check_tensors(tensors, layout, ranks, "pack_rank_blocks");
  char* dst = static_cast<char*>(flat);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (layout.bytes[i] == 0) continue;
      const char* src = static_cast<const char*>(tensors[i].raw()) + size_t(r) * layout.bytes[i];
      be.copy(dst + size_t(r) * layout.block_bytes + layout.offset[i], src, layout.bytes[i],
              CopyKind::kDeviceToDevice, s);
    }
}

void unpack_rank_blocks(Backend& be, Stream& s, const void* flat,
                        const std::vector<Tensor>& tensors, const BucketLayout& layout, int ranks) {
  check_tensors(tensors, layout, ranks, "unpack_rank_blocks");
  const char* src = static_cast<const char*>(flat);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (layout.bytes[i] == 0) continue;
      char* dst = static_cast<char*>(tensors[i].raw()) + size_t(r) * layout.bytes[i];
      be.copy(dst, src + size_t(r) * layout.block_bytes + layout.offset[i], layout.bytes[i],
              CopyKind::kDeviceToDevice, s);
    }
}

}  // namespace meshtrain

namespace meshtrain::ops {

ValueId all_gather(Builder& b, ValueId x, MeshGroup group, int group_size) {
  if (group_size == 1) return x;
  return b.op1("all_gather", {x}, {{"group", int64_t(group)}, {"group_size", int64_t(group_size)}});
}

ValueId reduce_scatter(Builder& b, ValueId x, MeshGroup group, int group_size) {
  if (group_size == 1) return x;
  return b.op1("reduce_scatter", {x},
               {{"group", int64_t(group)}, {"group_size", int64_t(group_size)}});
}

ValueId all_reduce(Builder& b, ValueId x, MeshGroup group, ReduceOp op, AllReduceGrad grad) {
  return b.op1("all_reduce", {x},
               {{"group", int64_t(group)}, {"reduce_op", int64_t(op)}, {"grad", int64_t(grad)}});
}

ValueId replicate_grad(Builder& b, ValueId x, MeshGroup group) {
  return b.op1("replicate_grad", {x}, {{"group", int64_t(group)}});
}

std::vector<ValueId> all_gather_bucket(Builder& b, const std::vector<ValueId>& xs, MeshGroup group,
                                       int group_size) {
  if (group_size == 1) return xs;
  return b.op("all_gather", xs, {{"group", int64_t(group)}, {"group_size", int64_t(group_size)}});
}

std::vector<ValueId> reduce_scatter_bucket(Builder& b, const std::vector<ValueId>& xs,
                                           MeshGroup group, int group_size) {
  if (group_size == 1) return xs;
  return b.op("reduce_scatter", xs,
              {{"group", int64_t(group)}, {"group_size", int64_t(group_size)}});
}

std::vector<ValueId> all_reduce_bucket(Builder& b, const std::vector<ValueId>& xs, MeshGroup group,
                                       ReduceOp op, AllReduceGrad grad) {
  return b.op("all_reduce", xs,
              {{"group", int64_t(group)}, {"reduce_op", int64_t(op)}, {"grad", int64_t(grad)}});
}

namespace {
TensorMeta scaled_dim0(const TensorMeta& m, int64_t num, int64_t den, const char* op) {
  MT_CHECK_T(ShapeError, m.shape.rank() >= 1, "{} needs rank >= 1, found {}", op, m.shape);
  MT_CHECK_T(ShapeError, (m.shape[0] * num) % den == 0,
             "{}: dim 0 of {} does not divide by the group size {}", op, m.shape, den);
  return {m.shape.with(0, m.shape[0] * num / den), m.dtype};
}

void register_kernel_all(const std::string& op, KernelFn fn, WorkspaceFn workspace = {}) {
  for (DeviceType d : {DeviceType::kCPU, DeviceType::kCUDA})
    OpRegistry::instance().add_kernel(op, d, fn, workspace);
}

// The inputs' metas; a bucket's inputs share one dtype (one flat buffer).
std::vector<TensorMeta> same_dtype(const std::vector<TensorMeta>& in, const char* op) {
  MT_CHECK_T(ShapeError, !in.empty(), "{} needs at least one input", op);
  for (const TensorMeta& m : in)
    MT_CHECK_T(ValueError, m.dtype == in[0].dtype,
               "{}: a bucket holds one dtype; input 0 is {}, another input is {}", op,
               dtype_name(in[0].dtype), dtype_name(m.dtype));
  return in;
}

// Each input scaled along dim 0; a bucket's inputs share one dtype (one flat buffer).
std::vector<TensorMeta> scaled_each(const std::vector<TensorMeta>& in, int64_t num, int64_t den,
                                    const char* op) {
  std::vector<TensorMeta> out;
  for (const TensorMeta& m : same_dtype(in, op)) out.push_back(scaled_dim0(m, num, den, op));
  return out;
}

// A bucket's gradients: `collective` over the outputs' gradients that are present (one node),
// each result handed back to its input; inputs without an output gradient get none.
template <typename Collect>
std::vector<ValueId> over_present_grads(GradContext& c, Collect collective) {
  std::vector<ValueId> present;
  for (ValueId g : c.grad_outputs)
    if (g != kNoValue) present.push_back(g);
  std::vector<ValueId> grads(c.grad_outputs.size(), kNoValue);
  if (present.empty()) return grads;
  const std::vector<ValueId> done = collective(present);
  for (size_t i = 0, next = 0; i < grads.size(); ++i)
    if (c.grad_outputs[i] != kNoValue) grads[i] = done[next++];
  return grads;
}

// The bucket's gradient: the dual collective over the inputs whose outputs have a gradient.
std::vector<ValueId> bucket_backward(GradContext& c, bool gather) {
  const MeshGroup group = c.attrs().group();
  const int k = int(c.attrs().i("group_size"));
  return over_present_grads(c, [&](const std::vector<ValueId>& present) {
    return gather ? reduce_scatter_bucket(c.b, present, group, k)
                  : all_gather_bucket(c.b, present, group, k);
  });
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One rank block of a bucket: the tensors' bytes back to back.
size_t flat_block_bytes(const std::vector<TensorMeta>& metas) {
  size_t block = 0;
  for (const TensorMeta& m : metas) block += m.nbytes();
  return block;
}

// Workspace of a bucket of N > 1 tensors: the flat send buffer and the flat receive buffer
// (one rank block on one side, `group_size` on the other), each rounded up to 256 bytes.
size_t bucket_workspace(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                        const Attrs& a, bool gather) {
  if (in.size() < 2) return 0;
  const size_t block = flat_block_bytes(gather ? in : out);
  return round_up_256(block) + round_up_256(block * size_t(a.i("group_size")));
}

// An all-reduce's gradient, by the placement it implements (see AllReduceGrad); a bucket's
// present gradients go through one bucketed all-reduce.
std::vector<ValueId> all_reduce_backward(GradContext& c) {
  const auto mode = AllReduceGrad(c.attrs().i("grad"));
  MT_CHECK(mode != AllReduceGrad::kNone,
           "all_reduce over {} at '{}' is not differentiable (built with kNone)", c.attrs().group(),
           c.node.scope);
  if (mode == AllReduceGrad::kIdentity) return c.grad_outputs;
  const MeshGroup group = c.attrs().group();
  return over_present_grads(c, [&](const std::vector<ValueId>& present) {
    return all_reduce_bucket(c.b, present, group, ReduceOp::kSum,
                             mode);  // N = 1: all_reduce's node
  });
}

std::vector<size_t> block_bytes_of(const std::vector<Tensor>& shards) {
  std::vector<size_t> b;
  for (const Tensor& t : shards) b.push_back(t.nbytes());
  return b;
}

Tensor flat_view(const Tensor& workspace, size_t byte_offset, size_t bytes, DType dtype) {
  const int64_t n = int64_t(bytes / dtype_size(dtype));
  return Tensor(workspace.storage(), workspace.byte_offset() + byte_offset, Shape{n}, dtype);
}
}  // namespace

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op(
      {.name = "all_gather",
       .infer = [](const std::vector<TensorMeta>& in,
                   const Attrs& a) { return scaled_each(in, a.i("group_size"), 1, "all_gather"); },
       .backward = [](GradContext& c) { return bucket_backward(c, true); },
       .collective = Collective::kAllGather});
  r.add_op({.name = "reduce_scatter",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  return scaled_each(in, 1, a.i("group_size"), "reduce_scatter");
                },
            .backward = [](GradContext& c) { return bucket_backward(c, false); },
            .collective = Collective::kReduceScatter});
  r.add_op({.name = "all_reduce",
            .infer = [](const std::vector<TensorMeta>& in,
                        const Attrs&) { return same_dtype(in, "all_reduce"); },
            .backward = all_reduce_backward,
            .collective = Collective::kAllReduce});
  r.add_op({.name = "replicate_grad",
            .infer = [](const std::vector<TensorMeta>& in,
                        const Attrs&) { return std::vector<TensorMeta>{in.at(0)}; },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{all_reduce(c.b, c.grad_out(0), c.attrs().group(),
                                                         ReduceOp::kSum, AllReduceGrad::kIdentity)};
                },
            .view_of_input = 0});

  // A bucket packs its shards into the workspace, runs one collective into the rest of it and
  // unpacks, all on the node's stream: the bytes each rank receives are the single ops' bytes.
  register_kernel_all(
      "all_gather",
      [](KernelContext& c) {
        Communicator& comm = c.services->comm(c.attrs().group());
        if (c.in.size() == 1) {
          comm.all_gather(c.in[0], c.out[0], *c.stream);
          return;
        }
        Backend& be = c.services->backend();
        const BucketLayout l = bucket_layout(block_bytes_of(c.in));
        const size_t send_bytes = round_up_256(l.block_bytes);
        const int k = comm.size();
        Tensor send = flat_view(c.workspace, 0, l.block_bytes, c.in[0].dtype());
        Tensor recv =
            flat_view(c.workspace, send_bytes, l.block_bytes * size_t(k), c.in[0].dtype());
        pack_rank_blocks(be, *c.stream, c.in, send.raw(), l, 1);
        comm.all_gather(send, recv, *c.stream);
        unpack_rank_blocks(be, *c.stream, recv.raw(), c.out, l, k);
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out, const Attrs& a) {
        return bucket_workspace(in, out, a, true);
      });
  register_kernel_all(
      "reduce_scatter",
      [](KernelContext& c) {
        Communicator& comm = c.services->comm(c.attrs().group());
        if (c.in.size() == 1) {
          comm.reduce_scatter(c.in[0], c.out[0], ReduceOp::kSum, *c.stream);
          return;
        }
        Backend& be = c.services->backend();
        const BucketLayout l = bucket_layout(block_bytes_of(c.out));
        const int k = comm.size();
        const size_t send_bytes = round_up_256(l.block_bytes * size_t(k));
        Tensor send = flat_view(c.workspace, 0, l.block_bytes * size_t(k), c.in[0].dtype());
        Tensor recv = flat_view(c.workspace, send_bytes, l.block_bytes, c.in[0].dtype());
        pack_rank_blocks(be, *c.stream, c.in, send.raw(), l, k);
        comm.reduce_scatter(send, recv, ReduceOp::kSum, *c.stream);
        unpack_rank_blocks(be, *c.stream, recv.raw(), c.out, l, 1);
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out, const Attrs& a) {
        return bucket_workspace(in, out, a, false);
      });
  register_kernel_all(
      "all_reduce",
      [](KernelContext& c) {
        Communicator& comm = c.services->comm(c.attrs().group());
        Backend& be = c.services->backend();
        const auto op = ReduceOp(c.attrs().i("reduce_op"));
        // Out-of-place in the graph, in place for the communicator: copy first (same stream).
        if (c.in.size() == 1) {
          be.copy(c.out[0].raw(), c.in[0].raw(), c.in[0].nbytes(), CopyKind::kDeviceToDevice,
                  *c.stream);
          comm.all_reduce(c.out[0], op, *c.stream);
          return;
        }
        const BucketLayout l = bucket_layout(block_bytes_of(c.in));
        Tensor flat = flat_view(c.workspace, 0, l.block_bytes, c.in[0].dtype());
        pack_rank_blocks(be, *c.stream, c.in, flat.raw(), l, 1);
        comm.all_reduce(flat, op, *c.stream);
        unpack_rank_blocks(be, *c.stream, flat.raw(), c.out, l, 1);
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        // A bucket of N > 1 tensors: one flat buffer, reduced in place.
        return in.size() < 2 ? size_t(0) : round_up_256(flat_block_bytes(in));
      });
  register_kernel_all("replicate_grad", [](KernelContext&) {});  // a view in forward
}

}  // namespace meshtrain::ops
