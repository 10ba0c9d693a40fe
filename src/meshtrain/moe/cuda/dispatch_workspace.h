// Scratch sizes of the CUDA dispatch-plan and permutation kernels: their registrations size the
// workspace from the same numbers the kernels use. Sizes depend on shapes only, never on the
// routing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "meshtrain/ops/cuda/cuda_workspace.h"

namespace meshtrain::cuda {

// moe_dispatch_plan counts and ranks the routed choices in chunks of this many (one block per
// chunk): the workspace holds one int32 per (chunk, expert), first the chunk's count, then the
// first row its choices of that expert take.
constexpr int64_t kDispatchChunk = 1024;
inline int64_t dispatch_chunks(int64_t choices) {
  return std::max<int64_t>(1, (choices + kDispatchChunk - 1) / kDispatchChunk);
}
inline size_t dispatch_plan_workspace_bytes(int64_t choices, int64_t experts) {
  return align_ws(size_t(dispatch_chunks(choices)) * size_t(experts) * sizeof(int32_t));
}

// moe_permute: the inverse of the row map, one int32 per buffer row (-1 for padding rows), so
// every output row is written exactly once (data or zeros) with no memset of the whole buffer.
inline size_t moe_permute_workspace_bytes(int64_t capacity) {
  return align_ws(size_t(std::max<int64_t>(capacity, 1)) * sizeof(int32_t));
}

}  // namespace meshtrain::cuda
