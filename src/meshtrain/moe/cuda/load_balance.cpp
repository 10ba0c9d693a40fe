// CUDA kernels for moe_token_counts and expert_bias_update: dtype and size checks, then the
// launchers of load_balance.cu.
#include "meshtrain/moe/load_balance.h"

#include "meshtrain/moe/cuda/load_balance_kernels.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"

namespace meshtrain::cuda {
namespace {

// The token-count histogram lives in 48 KB of shared memory.
constexpr int64_t kMaxCountExperts = 12288;

MT_REGISTER_OPS {
  auto& reg = OpRegistry::instance();
  reg.add_kernel_factory(
      "moe_token_counts", DeviceType::kCUDA, [](const Node& node, const Graph& g) -> KernelFn {
        const int64_t e = node.attrs.i("num_experts");
        MT_CHECK_T(ValueError, e <= kMaxCountExperts,
                   "moe_token_counts at '{}' on CUDA: at most {} experts, found {}", node.scope,
                   kMaxCountExperts, e);
        const DType dt = g.value(node.outputs.at(0)).meta.dtype;
        return [dt, e](KernelContext& c) {
          moe_token_counts(dt, static_cast<const int32_t*>(c.in[0].raw()), c.in[0].numel(), e,
                           c.out[0].raw(), native_stream(*c.stream));
        };
      });
  reg.add_kernel_factory(
      "expert_bias_update", DeviceType::kCUDA, [](const Node& node, const Graph& g) -> KernelFn {
        const DType dt = g.value(node.inputs.at(0)).meta.dtype;
        MT_CHECK_T(ValueError, dt == DType::kF32 || dt == DType::kF64,
                   "expert_bias_update at '{}' on CUDA: expected float32 or float64, found {}",
                   node.scope, dtype_name(dt));
        const double coeff = node.attrs.f("coeff");
        return [dt, coeff](KernelContext& c) {
          void* counter = c.in[1].raw();
          const void* counts = c.in.size() == 4 ? c.in[3].raw() : counter;
          expert_bias_update(dt, c.in[0].raw(), counter, c.in[2].raw(), counts, c.in[0].numel(),
                             coeff, native_stream(*c.stream));
        };
      });
}

}  // namespace
}  // namespace meshtrain::cuda
