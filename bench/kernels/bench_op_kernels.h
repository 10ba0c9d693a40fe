// Runs single ops of a small graph through the op registry's own CUDA kernels (the factories
// the executor calls), outside an executor: device memory for every value, one KernelContext per
// node, so a benchmark times exactly the launches a step makes for that node.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "bench_common.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"

namespace meshtrain::bench {

// Device memory for every value of a graph and each node's kernel with its context.
class GraphKernels {
 public:
  GraphKernels(const Graph& g, Stream& stream) : scalars_(g.scalar_names().size(), 0.0) {
    for (ValueId v = 0; v < g.num_values(); ++v) {
      const TensorMeta& m = g.value(v).meta;
      bufs_.push_back(std::make_unique<DeviceBuffer>(std::max<size_t>(m.nbytes(), 256)));
      tensors_.push_back(
          Tensor::wrap(bufs_.back()->get(), m.shape, m.dtype, Device{DeviceType::kCUDA, 0}));
    }
    for (const Node& n : g.nodes()) {
      Entry e;
      e.fn = OpRegistry::instance().make_kernel(n, g, DeviceType::kCUDA);
      const size_t ws = OpRegistry::instance().workspace_bytes(n, g, DeviceType::kCUDA);
      if (ws > 0) {
        e.ws = std::make_unique<DeviceBuffer>((ws + 3) / 4 * 4);
        e.ctx.workspace = Tensor::wrap(e.ws->get(), Shape{int64_t((ws + 3) / 4)}, DType::kF32,
                                       Device{DeviceType::kCUDA, 0});
      }
      e.ctx.node = &n;
      for (ValueId v : n.inputs) e.ctx.in.push_back(tensors_[size_t(v)]);
      for (ValueId v : n.outputs) e.ctx.out.push_back(tensors_[size_t(v)]);
      e.ctx.stream = &stream;
      e.ctx.scalars = &scalars_;
      entries_.emplace(n.id, std::move(e));
    }
  }
  void run(NodeId n) {
    Entry& e = entries_.at(n);
    e.fn(e.ctx);
  }
  void* ptr(ValueId v) const { return bufs_[size_t(v)]->get(); }
  // The host scalars (Graph::add_scalar slots) the kernels read at launch.
  std::vector<double>& scalars() { return scalars_; }

 private:
  struct Entry {
    KernelFn fn;
    KernelContext ctx;
    std::unique_ptr<DeviceBuffer> ws;
  };
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;
  std::vector<Tensor> tensors_;
  std::vector<double> scalars_;
  std::map<NodeId, Entry> entries_;
};

}  // namespace meshtrain::bench
