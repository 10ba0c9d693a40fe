// Host copies of a MoE layer's expert groups ([2, E] int32: start row and count per expert), for
// the CUDA ops that need the counts on the host (cuBLAS takes each expert GEMM's extents there).
// moe_dispatch_plan publishes its groups: right after computing them it copies them into a pinned
// buffer and records an event, so a grouped GEMM waits for that plan only (cudaEventSynchronize),
// not for its whole stream, and the backward's GEMMs, long after the plan, do not wait at all.
// One state per (graph, groups value), made when the executor prepares the graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "meshtrain/ir/ir.h"

namespace meshtrain::cuda {

struct HostGroups {
  int64_t experts = 0;
  int32_t* pinned = nullptr;  // [2, E]
  cudaEvent_t ready = nullptr;
  explicit HostGroups(int64_t e);
  ~HostGroups();
  HostGroups(const HostGroups&) = delete;
  HostGroups& operator=(const HostGroups&) = delete;
};

// The state of value `groups` of `graph` (created on first use).
std::shared_ptr<HostGroups> host_groups_of(const Graph& graph, ValueId groups, int64_t experts);

// True when `groups` is the output its producer's op publishes (OpDef::publishes_groups_output:
// moe_dispatch_plan's groups).
bool groups_published(const Graph& graph, ValueId groups);

}  // namespace meshtrain::cuda
