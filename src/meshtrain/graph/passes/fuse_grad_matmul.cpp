// fuse_grad_matmul (see header): walk back from each sink's source through views to its
// producer, then rewrite the sink in place (its id is after the producer's, whose inputs the new
// node reads, so ids stay topological) and schedule it where the producer was.
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
  // The schedule before any producer dies, and per producer the sink that takes its place there.
  const std::vector<NodeId> order = g.schedule();
  std::vector<NodeId> sink_at(size_t(g.num_nodes()), kNoNode);
  std::vector<char> moved(size_t(g.num_nodes()), 0);
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
    // Every attribute of the producer carries over (its kernel choice among them): the
    // accumulating form takes the producer's attributes and adds the sink's overwrite.
    Attrs attrs = producer.attrs;
    attrs.set("overwrite", int64_t(sink.attrs.b("overwrite")));
    std::vector<ValueId> inputs{dst};
    inputs.insert(inputs.end(), producer.inputs.begin(), producer.inputs.end());
    const std::string scope = producer.scope;
    const BlockIndex block = producer.block;
    // The only writer of its buffer in this graph: it can run at the producer's place.
    if (consumers[size_t(dst)].size() == 1) {
      sink_at[size_t(producer.id)] = id;
      moved[size_t(id)] = 1;
    }
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
  if (rewritten == 0) return 0;
  // Each fused sink runs where its product was made, not at the end of the backward where the
  // sinks were appended: the GEMM's inputs (the layer's activation and output gradient) die at
  // their last use there, instead of living through the rest of the backward.
  std::vector<NodeId> placed;
  placed.reserve(order.size());
  for (NodeId id : order) {
    if (sink_at[size_t(id)] != kNoNode)
      placed.push_back(sink_at[size_t(id)]);
    else if (!g.node(id).dead && !moved[size_t(id)])
      placed.push_back(id);
  }
  g.set_schedule(std::move(placed));
  return rewritten;
}

}  // namespace meshtrain
