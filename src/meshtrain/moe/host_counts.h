// Host copies of small int32 tensors that a kernel already holds on the host: the expert
// exchange builds its local expert groups on the host at its sync point, and the CUDA grouped
// GEMMs need exactly those counts on the host (cuBLAS takes each GEMM's extents there). The
// producer publishes a pointer to its host copy, made when the executor prepares the graph; a
// consumer later in the schedule reads it at launch with no device round trip and no wait (the
// executor launches a rank's nodes in schedule order from one thread). One entry per
// (graph, value); the producer's op declares it with OpDef::host_published_output.
#pragma once

#include <cstdint>
#include <memory>

#include "meshtrain/ir/ir.h"

namespace meshtrain::ops {

struct HostPublished {
  const int32_t* data = nullptr;  // set by the producer's kernel factory
  int64_t count = 0;              // int32 elements
};

// The entry of value `v` of `graph` (created on first use; producer and consumers share it).
std::shared_ptr<HostPublished> host_published_of(const Graph& graph, ValueId v);

// True when the producer of `v` declares that it publishes `v` on the host.
bool host_published_by_producer(const Graph& graph, ValueId v);

}  // namespace meshtrain::ops
