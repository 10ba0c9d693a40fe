// The op registry: every op's definition (shape inference, backward rule, flags) and its kernels
// per device type, each kernel with the size of the scratch it lays out. Op families register
// themselves from src/meshtrain/ops/ with MT_REGISTER_OPS; graph code finds them here by name only.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/ir/ir.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

class Builder;

// What a backward rule sees: the forward node, the gradients of its outputs (kNoValue where an
// output has no gradient) and which inputs need one. It returns one entry per input.
struct GradContext {
  Builder& b;
  const Node& node;
  const std::vector<ValueId>& grad_outputs;
  const std::vector<bool>& needs_grad;
  ValueId in(int i) const { return node.inputs.at(size_t(i)); }
  ValueId out(int i) const { return node.outputs.at(size_t(i)); }
  ValueId grad_out(int i) const { return grad_outputs.at(size_t(i)); }
  const Attrs& attrs() const { return node.attrs; }
};

using InferFn = std::function<std::vector<TensorMeta>(const std::vector<TensorMeta>& inputs,
                                                      const Attrs& attrs)>;
using BackwardFn = std::function<std::vector<ValueId>(GradContext& ctx)>;
// FLOPs of one node of a compute-heavy op whose count is not the matmul rule (2 · output
// elements · the last dim of input 0), from the shapes and attrs alone (the cost model).
using FlopsFn = std::function<int64_t(const std::vector<TensorMeta>& inputs, const Attrs& attrs)>;
// Scratch bytes a kernel needs for one node (shapes only, never data: the memory plan is fixed
// before the first step). Registered with the kernel that lays the scratch out.
using WorkspaceFn =
    std::function<size_t(const std::vector<TensorMeta>& inputs,
                         const std::vector<TensorMeta>& outputs, const Attrs& attrs)>;

// What a collective op does over the mesh group in its "group" attribute (see comm/).
enum class Collective : uint8_t {
  kNone,
  kAllGather,      // [n, ...] on each of k ranks -> [k·n, ...]
  kReduceScatter,  // [k·n, ...] -> block r of the sum, on rank r
  kAllReduce,      // the sum on every rank
  kExchange,       // the expert-parallel token exchange (all_to_all_v, data-dependent sizes)
};
const char* collective_name(Collective c);  // "all_gather", ..., "exchange"

struct OpDef {
  std::string name;
  InferFn infer;
  BackwardFn backward;  // empty: not differentiable (its inputs get no gradient)
  // Properties: what passes decide by (a pass never tests an op's name).
  int view_of_input = -1;    // >= 0: output 0 is a view of that input's memory (no copy)
  bool side_effect = false;  // writes persistent inputs in place; never removed as dead code
  Collective collective = Collective::kNone;  // communicates; runs on its mesh group's stream
  bool recomputable = true;    // false: a recompute pass never clones it (the token exchange)
  bool cast = false;           // converts the dtype, element for element
  bool rearranges = false;     // output elements are input elements moved (reshape, slice, ...)
  bool compute_heavy = false;  // matmul-class cost: per-op selective AC saves its outputs
  FlopsFn flops;               // compute_heavy ops only; empty: the matmul rule
  bool sums_inputs = false;    // output = element-wise sum of its same-shaped inputs
  // A gradient sink (accumulate): adds input 1 into the persistent input 0 in place (attr
  // "overwrite": writes it instead). No outputs.
  bool accumulates_in_place = false;
  // The op that adds this op's output 0 into a destination in place: its inputs are the
  // destination then this op's inputs, its attrs this op's plus "overwrite" (matmul names
  // matmul_accumulate). Empty: none. graph/passes/fuse_grad_matmul uses it.
  std::string accumulating_form;
  // Output = zeros of extent attr "full_extent" along attr "dim", input 0 placed at attr
  // "start": the gradient of a slice.
  bool pads_slice = false;
  // Data-sized rows (the expert-parallel exchange, graph/row_capacity.h): a capacity source's
  // kernel learns at its host sync point how many rows the step needs and calls
  // KernelContext::capacity->fit(rows); an op with capacity_from_input >= 0 has an output 0 whose
  // rows follow the source that produced that input (planned at attr "capacity").
  bool capacity_source = false;
  int capacity_from_input = -1;
  // >= 0: the kernel also publishes that output on the host (moe/host_counts.h).
  int host_published_output = -1;
  // >= 0: that output is a MoE layer's expert groups, which the CUDA kernel also copies to pinned
  // host memory for the grouped GEMMs (moe/cuda/plan_groups.h).
  int publishes_groups_output = -1;
  bool is_collective() const { return collective != Collective::kNone; }
};

// Rows of the data-sized buffers that follow a capacity source (see OpDef::capacity_source).
class RowCapacity {
 public:
  virtual ~RowCapacity() = default;
  // Makes the buffers that follow this node hold at least `rows` rows (within the plan: nothing
  // changes; beyond it: a pool, grown when needed, never past `most`, the most rows the source
  // can ever need); returns the rows now bound.
  virtual int64_t fit(int64_t rows, int64_t most) = 0;
  virtual int64_t planned_rows() const = 0;
};

// Services a kernel may call: the communicator of a mesh group.
class ExecServices {
 public:
  virtual ~ExecServices() = default;
  virtual Communicator& comm(MeshGroup group) = 0;
  virtual Backend& backend() = 0;
};

struct KernelContext {
  const Node* node = nullptr;
  std::vector<Tensor> in;
  std::vector<Tensor> out;
  Tensor workspace;
  Stream* stream = nullptr;
  ExecServices* services = nullptr;
  const std::vector<double>* scalars = nullptr;  // the executor's host scalars (Graph::add_scalar)
  RowCapacity* capacity = nullptr;               // set for capacity sources (OpDef)
  const Attrs& attrs() const { return node->attrs; }
  double scalar(const std::string& slot_attr) const {
    return scalars->at(size_t(node->attrs.i(slot_attr)));
  }
};

// A kernel's tensors as typed pointers, for every backend's kernels (the op layer has checked
// their dtypes): inputs, outputs, and persistent inputs a kernel updates in place (accumulate,
// optimizer updates).
template <typename T>
const T* in_ptr(const KernelContext& c, int i) {
  return static_cast<const T*>(c.in.at(size_t(i)).raw());
}
template <typename T>
T* out_ptr(const KernelContext& c, int i) {
  return static_cast<T*>(c.out.at(size_t(i)).raw());
}
template <typename T>
T* inout_ptr(const KernelContext& c, int i) {
  return static_cast<T*>(c.in.at(size_t(i)).raw());
}

using KernelFn = std::function<void(KernelContext&)>;
// Runs once when the executor prepares the graph; returns the function called every step.
using KernelFactory = std::function<KernelFn(const Node& node, const Graph& graph)>;
// The same with the executor's services, for kernels whose prepared state needs the backend
// (pinned host buffers) or a communicator. `services` may be null (graphs run without a mesh).
using ServicesKernelFactory =
    std::function<KernelFn(const Node& node, const Graph& graph, ExecServices* services)>;

class OpRegistry {
 public:
  static OpRegistry& instance();
  void add_op(OpDef def);
  const OpDef& op(const std::string& name) const;
  bool has_op(const std::string& name) const { return ops_.count(name) > 0; }
  std::vector<std::string> op_names() const;

  // `workspace` empty: the kernel needs no scratch.
  void add_kernel(const std::string& op, DeviceType device, KernelFn fn,
                  WorkspaceFn workspace = {});
  void add_kernel_factory(const std::string& op, DeviceType device, KernelFactory factory,
                          WorkspaceFn workspace = {});
  void add_kernel_factory(const std::string& op, DeviceType device, ServicesKernelFactory factory,
                          WorkspaceFn workspace = {});
  bool has_kernel(const std::string& op, DeviceType device) const;
  KernelFn make_kernel(const Node& node, const Graph& graph, DeviceType device,
                       ExecServices* services = nullptr) const;
  // Scratch bytes of the node's kernel on `device` (what the memory plan reserves); ValueError when
  // the op has no kernel there.
  size_t workspace_bytes(const Node& node, const Graph& graph, DeviceType device) const;
  // The same for other input/output metas (the row-capacity pool sizes scratch for more rows).
  size_t workspace_bytes(const Node& node, DeviceType device, const std::vector<TensorMeta>& inputs,
                         const std::vector<TensorMeta>& outputs) const;

 private:
  struct Kernel {
    ServicesKernelFactory factory;
    WorkspaceFn workspace;
  };
  const Kernel& kernel(const std::string& op, DeviceType device) const;
  std::map<std::string, OpDef> ops_;
  std::map<std::pair<std::string, DeviceType>, Kernel> kernels_;
};

}  // namespace meshtrain

#define MT_REGISTER_CONCAT_(a, b) a##b
#define MT_REGISTER_CONCAT(a, b) MT_REGISTER_CONCAT_(a, b)
// MT_REGISTER_OPS { OpRegistry::instance().add_op(...); }  — runs at static-initialisation time.
#define MT_REGISTER_OPS                                            \
  static void MT_REGISTER_CONCAT(mt_register_, __LINE__)();        \
  static const bool MT_REGISTER_CONCAT(mt_registered_, __LINE__) = \
      (MT_REGISTER_CONCAT(mt_register_, __LINE__)(), true);        \
  static void MT_REGISTER_CONCAT(mt_register_, __LINE__)()
