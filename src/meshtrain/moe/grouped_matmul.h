// Grouped GEMM of the routed experts: expert e multiplies the rows of its group in an
// expert-major buffer (moe_permute's layout: groups[0][e] = start row, groups[1][e] = count) by
// its own weight. Weights are [E, N, K] used transposed like linear (torchtitan's experts:
// w1/w3 [E, hidden, dim], w2 [E, dim, hidden], x @ w[e]ᵀ), or [E, K, N] untransposed (the
// backward's dx). Rows outside every group are never read and are written as zeros.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// Which kernels run the grouped GEMMs on CUDA ([model] expert_gemm_backend): kAuto takes
// meshtrain's Hopper grouped GEMM up to a mean of 768 rows per expert and per-expert cuBLASLt above
// (moe/cuda/grouped_matmul.cu says why); kCublas always the latter; kMeshtrain always the former
// (it reads the group offsets on the device, so the host waits for no plan; a node it cannot run
// is an error naming it). The CPU kernels ignore it: every choice computes the same function.
enum class ExpertGemmKernel : int64_t { kAuto = 0, kCublas = 1, kMeshtrain = 2 };
const char* expert_gemm_kernel_name(ExpertGemmKernel k);  // "auto" | "cublas" | "meshtrain"
ExpertGemmKernel expert_gemm_kernel_of(const Attrs& attrs);

// x [C, K], w [E, N, K] (transpose_w) or [E, K, N], groups [2, E] int32 -> [C, N].
// Backward: dx = grouped_matmul(dy, w, groups, !transpose_w); dw = grouped_matmul_wgrad; both
// with the forward's kernel.
ValueId grouped_matmul(Builder& b, ValueId x, ValueId w, ValueId groups, bool transpose_w = true,
                       ExpertGemmKernel kernel = ExpertGemmKernel::kAuto);

// a [C, P], b [C, Q], groups [2, E] -> [E, P, Q] with out[e] = a[rows of e]ᵀ · b[rows of e];
// zero for experts that received no rows. The weight gradient of grouped_matmul.
ValueId grouped_matmul_wgrad(Builder& b, ValueId a, ValueId bm, ValueId groups,
                             ExpertGemmKernel kernel = ExpertGemmKernel::kAuto);

inline constexpr const char* kGroupedWgradAccumulateOp = "grouped_matmul_wgrad_accumulate";
// grouped_matmul_wgrad's accumulating form, a gradient sink (graph/passes/fuse_grad_matmul):
// dst [E, P, Q] (float32 for bf16 operands, else the operands' dtype) += the product, or = it when
// `overwrite` (experts with no rows then get zeros; otherwise they are left as they are). The pass
// keeps the wgrad's kernel.
void grouped_matmul_wgrad_accumulate(Builder& b, ValueId dst, ValueId a, ValueId bm, ValueId groups,
                                     bool overwrite,
                                     ExpertGemmKernel kernel = ExpertGemmKernel::kAuto);

// Checks that a groups tensor is int32 [2, experts] (ShapeError naming the op).
void check_groups(const TensorMeta& groups, int64_t experts, const char* op);
// Checks host values of groups [2, E] against a buffer of `rows` rows: each group inside it and
// after the previous one (ValueError naming the op and the expert). Both backends' kernels call it.
void check_group_rows(const int32_t* groups, int64_t experts, int64_t rows, const char* op);

}  // namespace meshtrain::ops
