// CUDA kernels for `matmul` and `matmul_accumulate`: a factory that builds the node's cuBLASLt plan
// at prepare time (its shapes are fixed), so each step only launches. bf16 (fp32 accumulate), exact
// fp32, fp64.
#include "meshtrain/ops/matmul.h"

#include <cuda_runtime_api.h>

#include "meshtrain/ops/cuda/cublaslt_matmul.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {
namespace {

KernelFn make_matmul_kernel(const Node& node, const Graph& graph) {
  const bool ta = node.attrs.b("transpose_a"), tb = node.attrs.b("transpose_b");
  const TensorMeta& am = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& bm = graph.value(node.inputs.at(1)).meta;
  const ops::MatmulDims d = ops::matmul_dims(am, bm, ta, tb);
  MT_CHECK_T(ValueError,
             am.dtype == DType::kBF16 || am.dtype == DType::kF32 || am.dtype == DType::kF64,
             "matmul at '{}' on CUDA: expected dtype bfloat16, float32 or float64, found {}",
             node.scope, dtype_name(am.dtype));
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));  // the backend made its device current before prepare()
  // The algorithm is chosen for exactly the workspace this kernel registers below.
  std::shared_ptr<const GemmPlan> plan =
      gemm_plan(device, gemm_problem(am.dtype, ta, tb, d.m, d.n, d.k), kGemmWorkspaceBytes);
  return [plan](KernelContext& c) {
    plan->run(c.in[0].raw(), c.in[1].raw(), c.out[0].raw(),
              c.workspace.defined() ? c.workspace.raw() : nullptr,
              c.workspace.defined() ? c.workspace.nbytes() : 0,
              static_cast<cudaStream_t>(c.stream->native_handle()));
  };
}

// matmul_accumulate: the same plan with C = the destination (float32 for bf16 operands) and
// beta 1 unless it overwrites.
KernelFn make_matmul_accumulate_kernel(const Node& node, const Graph& graph) {
  const bool ta = node.attrs.b("transpose_a"), tb = node.attrs.b("transpose_b");
  const TensorMeta& dm = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& am = graph.value(node.inputs.at(1)).meta;
  const TensorMeta& bm = graph.value(node.inputs.at(2)).meta;
  const ops::MatmulDims d = ops::matmul_accumulate_dims(dm, am, bm, ta, tb);
  GemmProblem p = gemm_problem(am.dtype, ta, tb, d.m, d.n, d.k);
  p.out = dm.dtype;
  p.accumulate = !node.attrs.b("overwrite");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));  // the backend made its device current before prepare()
  std::shared_ptr<const GemmPlan> plan = gemm_plan(device, p, kGemmWorkspaceBytes);
  return [plan](KernelContext& c) {
    plan->run(c.in[1].raw(), c.in[2].raw(), c.in[0].raw(),
              c.workspace.defined() ? c.workspace.raw() : nullptr,
              c.workspace.defined() ? c.workspace.nbytes() : 0,
              static_cast<cudaStream_t>(c.stream->native_handle()));
  };
}

MT_REGISTER_OPS {
  // Scratch: cuBLASLt's recommended 32 MiB on Hopper (split-K partials, kernel scratch).
  OpRegistry::instance().add_kernel_factory(
      ops::kMatmulOp, DeviceType::kCUDA, make_matmul_kernel,
      [](const std::vector<TensorMeta>&, const std::vector<TensorMeta>&, const Attrs&) {
        return kGemmWorkspaceBytes;
      });
  OpRegistry::instance().add_kernel_factory(
      ops::kMatmulAccumulateOp, DeviceType::kCUDA, make_matmul_accumulate_kernel,
      [](const std::vector<TensorMeta>&, const std::vector<TensorMeta>&, const Attrs&) {
        return kGemmWorkspaceBytes;
      });
}

}  // namespace
}  // namespace meshtrain::cuda
