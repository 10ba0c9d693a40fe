// Dtype rules every communicator backend shares: what each collective accepts, which dtype a
// reduction accumulates in (bfloat16 accumulates in float32, rounded once at the end), and the
// bulk bf16 <-> f32 conversions used to stage bf16 reductions through float32 buffers.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/dtype.h"

namespace meshtrain {

// Every dtype moves (gather, scatter, all-to-all, broadcast); every dtype reduces with
// sum/max/min. bfloat16 reduces in float32 (comm_accumulate_dtype), integers reduce exactly.
DType comm_accumulate_dtype(DType d);
bool comm_needs_staging(DType d);  // true when accumulate dtype != storage dtype (bf16)

void bf16_to_f32(const BFloat16* src, float* dst, int64_t n);
void f32_to_bf16(const float* src, BFloat16* dst, int64_t n);

// Throws ValueError naming the communicator and collective when `t` is not a host tensor a
// CPU communicator can touch (undefined, or on another device).
void check_comm_tensor(const Tensor& t, Device want, const std::string& comm_name,
                       const char* collective, const char* which);

// Row length (elements per dim-0 slice) of a tensor of rank >= 1; used by all_to_all_v.
int64_t comm_row_elems(const Tensor& t);

// True when the byte ranges [a, a+na) and [b, b+nb) overlap (empty ranges never overlap).
bool comm_ranges_overlap(const void* a, size_t na, const void* b, size_t nb);

}  // namespace meshtrain
