// Helpers shared by CPU reference kernels: typed pointers from a KernelContext (the op layer has
// checked shapes and dtypes already) and the dtype switch, MT_DISPATCH_FLOAT.
#pragma once

#include "meshtrain/core/dtype_dispatch.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain::cpu {

template <typename T>
const T* in_ptr(const KernelContext& c, int i) {
  return static_cast<const T*>(c.in.at(size_t(i)).raw());
}
template <typename T>
T* out_ptr(const KernelContext& c, int i) {
  return static_cast<T*>(c.out.at(size_t(i)).raw());
}
// Kernels that write persistent inputs in place (accumulate, optimizer updates).
template <typename T>
T* inout_ptr(const KernelContext& c, int i) {
  return static_cast<T*>(c.in.at(size_t(i)).raw());
}
// `workspace` sizes the scratch the kernel reads as KernelContext::workspace (empty: none).
inline void add_cpu_kernel(const std::string& op, KernelFn fn, WorkspaceFn workspace = {}) {
  OpRegistry::instance().add_kernel(op, DeviceType::kCPU, std::move(fn), std::move(workspace));
}

}  // namespace meshtrain::cpu
