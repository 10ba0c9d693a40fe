// Host copies of published expert groups (see plan_groups.h).
#include "meshtrain/moe/cuda/plan_groups.h"

#include <map>
#include <mutex>
#include <utility>

#include "meshtrain/ir/op_registry.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {

HostGroups::HostGroups(int64_t e) : experts(e) {
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned),
                            size_t(2 * (e > 0 ? e : 1)) * sizeof(int32_t)));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
}

HostGroups::~HostGroups() {
  // At process exit the CUDA context may already be gone: errors are ignored here.
  cudaEventDestroy(ready);
  cudaFreeHost(pinned);
}

std::shared_ptr<HostGroups> host_groups_of(const Graph& graph, ValueId groups, int64_t experts) {
  static std::mutex mu;
  // Weak entries: the kernels of the graph own the state; a later graph at the same address
  // finds an expired entry (or one of another size) and makes its own.
  static std::map<std::pair<const Graph*, ValueId>, std::weak_ptr<HostGroups>> states;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = states[{&graph, groups}];
  std::shared_ptr<HostGroups> st = slot.lock();
  if (!st || st->experts != experts) {
    st = std::make_shared<HostGroups>(experts);
    slot = st;
  }
  return st;
}

bool groups_published(const Graph& graph, ValueId groups) {
  const NodeId p = graph.value(groups).producer;
  if (p == kNoNode) return false;
  const Node& n = graph.node(p);
  const int k = OpRegistry::instance().op(n.op).publishes_groups_output;
  return k >= 0 && size_t(k) < n.outputs.size() && n.outputs[size_t(k)] == groups;
}

}  // namespace meshtrain::cuda
