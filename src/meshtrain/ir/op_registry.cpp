// Op and kernel tables.
#include "meshtrain/ir/op_registry.h"

#include "meshtrain/core/check.h"

namespace meshtrain {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kNone: return "none";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kExchange: return "exchange";
  }
  return "?";
}

OpRegistry& OpRegistry::instance() {
  static OpRegistry r;
  return r;
}

void OpRegistry::add_op(OpDef def) {
  MT_CHECK(!def.name.empty() && def.infer, "op definitions need a name and shape inference");
  MT_CHECK(ops_.count(def.name) == 0, "op {} registered twice", def.name);
  std::string name = def.name;
  ops_.emplace(std::move(name), std::move(def));
}

const OpDef& OpRegistry::op(const std::string& name) const {
  auto it = ops_.find(name);
  MT_CHECK(it != ops_.end(), "unknown op '{}'", name);
  return it->second;
}

std::vector<std::string> OpRegistry::op_names() const {
  std::vector<std::string> names;
  for (auto& [k, v] : ops_) names.push_back(k);
  return names;
}

void OpRegistry::add_kernel(const std::string& op, DeviceType device, KernelFn fn,
                            WorkspaceFn workspace) {
  add_kernel_factory(op, device, KernelFactory([fn](const Node&, const Graph&) { return fn; }),
                     std::move(workspace));
}

void OpRegistry::add_kernel_factory(const std::string& op, DeviceType device, KernelFactory factory,
                                    WorkspaceFn workspace) {
  add_kernel_factory(
      op, device,
      ServicesKernelFactory([f = std::move(factory)](const Node& n, const Graph& g, ExecServices*) {
        return f(n, g);
      }),
      std::move(workspace));
}

void OpRegistry::add_kernel_factory(const std::string& op, DeviceType device,
                                    ServicesKernelFactory factory, WorkspaceFn workspace) {
  auto key = std::make_pair(op, device);
  MT_CHECK(kernels_.count(key) == 0, "kernel for op {} registered twice", op);
  kernels_.emplace(key, Kernel{std::move(factory), std::move(workspace)});
}

bool OpRegistry::has_kernel(const std::string& op, DeviceType device) const {
  return kernels_.count({op, device}) > 0;
}

const OpRegistry::Kernel& OpRegistry::kernel(const std::string& op, DeviceType device) const {
  auto it = kernels_.find({op, device});
  MT_CHECK_T(ValueError, it != kernels_.end(), "op '{}' has no kernel for the {} backend", op,
             device == DeviceType::kCPU ? "cpu" : "cuda");
  return it->second;
}

KernelFn OpRegistry::make_kernel(const Node& node, const Graph& graph, DeviceType device,
                                 ExecServices* services) const {
  return kernel(node.op, device).factory(node, graph, services);
}

size_t OpRegistry::workspace_bytes(const Node& node, const Graph& graph, DeviceType device) const {
  const Kernel& k = kernel(node.op, device);
  if (!k.workspace) return 0;
  std::vector<TensorMeta> ins, outs;
  for (ValueId v : node.inputs) ins.push_back(graph.value(v).meta);
  for (ValueId v : node.outputs) outs.push_back(graph.value(v).meta);
  return k.workspace(ins, outs, node.attrs);
}

size_t OpRegistry::workspace_bytes(const Node& node, DeviceType device,
                                   const std::vector<TensorMeta>& inputs,
                                   const std::vector<TensorMeta>& outputs) const {
  const Kernel& k = kernel(node.op, device);
  return k.workspace ? k.workspace(inputs, outputs, node.attrs) : 0;
}

}  // namespace meshtrain
