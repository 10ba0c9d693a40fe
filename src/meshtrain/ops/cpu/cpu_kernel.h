// Helpers shared by CPU reference kernels: the dtype switch (MT_DISPATCH_FLOAT) and kernel
// registration; typed pointers from a KernelContext are ir/op_registry.h's (in_ptr, out_ptr).
#pragma once

#include "meshtrain/core/dtype_dispatch.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain::cpu {

// `workspace` sizes the scratch the kernel reads as KernelContext::workspace (empty: none).
inline void add_cpu_kernel(const std::string& op, KernelFn fn, WorkspaceFn workspace = {}) {
  OpRegistry::instance().add_kernel(op, DeviceType::kCPU, std::move(fn), std::move(workspace));
}

}  // namespace meshtrain::cpu
