// fuse_grad_matmul (see header): walk back from each sink's source through views to its
// producer, then rewrite the sink in place (its id is after the producer's, whose inputs the new
// node reads, so ids stay topological).
#include "meshtrain/graph/passes/fuse_grad_matmul.h"

#include <algorithm>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

int fuse_grad_matmul(Graph& g) {
  const OpRegistry& reg = OpRegistry::instance();
  const std::vector<std::vector<NodeId>> consumers = g.consumers();
  const std::vector<ValueId>& outputs = g.outputs();
  // Read by one node and not by the host after the run.
  auto single_use = [&](ValueId v) {
    return consumers[size_t(v)].size() == 1 &&
           std::find(outputs.begin(), outputs.end(), v) == outputs.end();
  };
  int rewritten = 0;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& sink = g.node(id);
    if (sink.dead || !reg.op(sink.op).accumulates_in_place) continue;
    const ValueId dst = sink.inputs.at(0);
    ValueId src = sink.inputs.at(1);
    const DType src_dtype = g.value(src).meta.dtype;
    if (g.value(dst).meta.dtype != DType::kF32 || src_dtype != DType::kBF16) continue;
    // Views (reshape, grad_cast, replicate_grad's forward) move no data: the product's memory is
    // the source's, element for element.
    std::vector<NodeId> views;
    bool ok = true;
    while (ok) {
      const NodeId p = g.value(src).producer;
      if (p == kNoNode || !single_use(src)) {
        ok = false;
        break;
      }
      const Node& n = g.node(p);
      const OpDef& def = reg.op(n.op);
      if (def.view_of_input != 0) break;
      const TensorMeta& in = g.value(n.inputs.at(0)).meta;
      if (in.dtype != src_dtype || in.shape.numel() != g.value(src).meta.shape.numel()) {
        ok = false;
        break;
      }
      views.push_back(p);
      src = n.inputs.at(0);
    }
    if (!ok) continue;
    const Node& producer = g.node(g.value(src).producer);
    const OpDef& pdef = reg.op(producer.op);
    if (pdef.accumulating_form.empty() || producer.outputs.size() != 1) continue;
    Attrs attrs = producer.attrs;
    attrs.set("overwrite", int64_t(sink.attrs.b("overwrite")));
    std::vector<ValueId> inputs{dst};
    inputs.insert(inputs.end(), producer.inputs.begin(), producer.inputs.end());
    const std::string scope = producer.scope;
    const BlockIndex block = producer.block;
    g.node(producer.id).dead = true;
    for (NodeId v : views) g.node(v).dead = true;
    Node& out = g.node(id);
    out.op = pdef.accumulating_form;
    out.inputs = std::move(inputs);
    out.attrs = std::move(attrs);
    out.scope = scope;  // the weight's own module: traces name the GEMM, not the sink
    out.block = block;
    ++rewritten;
  }
  return rewritten;
}

}  // namespace meshtrain
