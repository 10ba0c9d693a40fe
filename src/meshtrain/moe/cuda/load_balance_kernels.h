// Launchers of the CUDA load-balancing kernels (moe_token_counts, expert_bias_update): raw device
// pointers, extents and a stream; shape and dtype checks happen once, in moe/cuda/load_balance.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/core/dtype.h"

namespace meshtrain::cuda {

// counts[e] = number of the n ids equal to e, as float32 or float64 (`dtype`). Integer counting
// (exact, order-free), converted once. Ids outside [0, experts) fail a device check.
void moe_token_counts(DType dtype, const int32_t* ids, int64_t n, int64_t experts, void* counts,
                      cudaStream_t stream);

// In place: bias += coeff · sign(mean − counts) minus its mean (coeff 0 leaves it), last_load =
// counts, counter = 0. The mean and the mean of the deltas are summed in float64 in index order
// by one thread, exactly as the CPU kernel does, so every rank and both backends agree bit for
// bit. `counts` may alias `counter`.
void expert_bias_update(DType dtype, void* bias, void* counter, void* last_load, const void* counts,
                        int64_t experts, double coeff, cudaStream_t stream);

}  // namespace meshtrain::cuda
