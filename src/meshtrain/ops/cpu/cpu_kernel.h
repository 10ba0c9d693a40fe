// Helpers shared by CPU reference kernels: the dtype switch (MT_DISPATCH_FLOAT) and kernel
// registration; typed pointers from a KernelContext are ir/op_registry.h's (in_ptr, out_ptr).
#pragma once

#include <vector>

#include "meshtrain/core/dtype_dispatch.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain::cpu {

// `workspace` sizes the scratch the kernel reads as KernelContext::workspace (empty: none).
inline void add_cpu_kernel(const std::string& op, KernelFn fn, WorkspaceFn workspace = {}) {
  OpRegistry::instance().add_kernel(op, DeviceType::kCPU, std::move(fn), std::move(workspace));
}

// A bf16 tensor widened to float32 (exact): the operands of the float32 GEMMs that write a bf16
// product straight into its float32 gradient (matmul_accumulate, grouped_matmul_wgrad_accumulate),
// the reference of the CUDA kernels (fp32 products and sums, no bf16 rounding of the result).
inline std::vector<float> widened_bf16(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const BFloat16* p = static_cast<const BFloat16*>(t.raw());
  for (size_t i = 0; i < out.size(); ++i) out[i] = float(p[i]);
  return out;
}

}  // namespace meshtrain::cpu
