// Collective op definitions and their kernels (one kernel for every backend: the Communicator
// of the group does the device-specific work on the node's stream).
#include "meshtrain/comm/collective_ops.h"

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

namespace {
TensorMeta scaled_dim0(const TensorMeta& m, int64_t num, int64_t den, const char* op) {
  MT_CHECK_T(ShapeError, m.shape.rank() >= 1, "{} needs rank >= 1, found {}", op, m.shape);
  MT_CHECK_T(ShapeError, (m.shape[0] * num) % den == 0,
             "{}: dim 0 of {} does not divide by the group size {}", op, m.shape, den);
  return {m.shape.with(0, m.shape[0] * num / den), m.dtype};
}

void register_kernel_all(const std::string& op, KernelFn fn) {
  for (DeviceType d : {DeviceType::kCPU, DeviceType::kCUDA})
    OpRegistry::instance().add_kernel(op, d, fn);
}
}  // namespace

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "all_gather",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  return std::vector<TensorMeta>{
                      scaled_dim0(in.at(0), a.i("group_size"), 1, "all_gather")};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{reduce_scatter(c.b, c.grad_out(0), c.attrs().group(),
                                                             int(c.attrs().i("group_size")))};
                },
            .collective = Collective::kAllGather});
  r.add_op({.name = "reduce_scatter",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  return std::vector<TensorMeta>{
                      scaled_dim0(in.at(0), 1, a.i("group_size"), "reduce_scatter")};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{all_gather(c.b, c.grad_out(0), c.attrs().group(),
                                                         int(c.attrs().i("group_size")))};
                },
            .collective = Collective::kReduceScatter});
  r.add_op({.name = "all_reduce",
            .infer = [](const std::vector<TensorMeta>& in,
                        const Attrs&) { return std::vector<TensorMeta>{in.at(0)}; },
            .backward =
                [](GradContext& c) {
                  auto mode = AllReduceGrad(c.attrs().i("grad"));
                  MT_CHECK(mode != AllReduceGrad::kNone,
                           "all_reduce over {} at '{}' is not differentiable (built with kNone)",
                           c.attrs().group(), c.node.scope);
                  if (mode == AllReduceGrad::kIdentity) return std::vector<ValueId>{c.grad_out(0)};
                  return std::vector<ValueId>{all_reduce(c.b, c.grad_out(0), c.attrs().group(),
                                                         ReduceOp::kSum,
                                                         AllReduceGrad::kAllReduce)};
                },
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

  register_kernel_all("all_gather", [](KernelContext& c) {
    Communicator& comm = c.services->comm(c.attrs().group());
    comm.all_gather(c.in[0], c.out[0], *c.stream);
  });
  register_kernel_all("reduce_scatter", [](KernelContext& c) {
    Communicator& comm = c.services->comm(c.attrs().group());
    comm.reduce_scatter(c.in[0], c.out[0], ReduceOp::kSum, *c.stream);
  });
  register_kernel_all("all_reduce", [](KernelContext& c) {
    Communicator& comm = c.services->comm(c.attrs().group());
    // Out-of-place in the graph, in place for the communicator: copy first (same stream).
    Backend& be = c.services->backend();
    be.copy(c.out[0].raw(), c.in[0].raw(), c.in[0].nbytes(), CopyKind::kDeviceToDevice, *c.stream);
    comm.all_reduce(c.out[0], ReduceOp(c.attrs().i("reduce_op")), *c.stream);
  });
  register_kernel_all("replicate_grad", [](KernelContext&) {});  // a view in forward
}

}  // namespace meshtrain::ops
