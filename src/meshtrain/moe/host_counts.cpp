// Host copies published by a producer kernel (see host_counts.h).
#include "meshtrain/moe/host_counts.h"

#include <map>
#include <mutex>
#include <utility>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain::ops {

std::shared_ptr<HostPublished> host_published_of(const Graph& graph, ValueId v) {
  static std::mutex mu;
  // Weak entries: the kernels of the graph own the state; a later graph at the same address
  // finds an expired entry and makes its own.
  static std::map<std::pair<const Graph*, ValueId>, std::weak_ptr<HostPublished>> entries;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = entries[{&graph, v}];
  std::shared_ptr<HostPublished> e = slot.lock();
  if (!e) {
    e = std::make_shared<HostPublished>();
    slot = e;
  }
  return e;
}

bool host_published_by_producer(const Graph& graph, ValueId v) {
  const NodeId p = graph.value(v).producer;
  if (p == kNoNode) return false;
  const Node& n = graph.node(p);
  const int k = OpRegistry::instance().op(n.op).host_published_output;
  return k >= 0 && size_t(k) < n.outputs.size() && n.outputs[size_t(k)] == v;
}

}  // namespace meshtrain::ops
