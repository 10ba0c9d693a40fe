// CUDA kernels for `attention` and `attention_backward`: factories that check dtype, head dims and
// scale once at prepare time (an unsupported node fails there, naming its scope) and bind the
// path: bfloat16 -> the attention library (cuDNN) where the build has it and the node's `kernel`
// allows it, else the tensor-core flash kernels (compiled head dims; the forward on Hopper's
// TMA/wgmma kernel where it has them); everything else -> the CUDA-core kernels. The workspace
// functions and the factories resolve the path the same way.
#include "meshtrain/ops/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <set>
#include <tuple>

#include "meshtrain/core/logging.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {
namespace {

AttnShape shape_of(const std::vector<TensorMeta>& in, const Attrs& a) {
  const ops::AttentionDims d = ops::attention_dims(in.at(0), in.at(1), in.at(2));
  AttnShape s;
  s.batch = d.batch;
  s.seq = d.seq;
  s.heads_q = d.heads_q;
  s.heads_kv = d.heads_kv;
  s.dim_qk = d.dim_qk;
  s.dim_v = d.dim_v;
  s.scale = a.f("softmax_scale");
  s.causal = a.b("causal");
  return s;
}

AttnShape shape_of(const Node& n, const Graph& g) {
  std::vector<TensorMeta> in;
  for (int i = 0; i < 3; ++i) in.push_back(g.value(n.inputs.at(size_t(i))).meta);
  return shape_of(in, n.attrs);
}

constexpr const char* kTensorCoreDims = "{(192, 128), (128, 128), (64, 64)}";
bool has_tensor_core_kernel(const AttnShape& s) {
  return attention_fwd_bf16_num_variants(s.dim_qk, s.dim_v) > 0;
}

// bf16 with compiled head dims -> tensor cores; other bf16 head dims, float32, float64 -> the
// CUDA-core kernel (head dims <= 256), with a warning for bf16 because it is far slower.
void check_supported(const Node& n, DType dtype, const AttnShape& s) {
  const char* op = n.op.c_str();
  MT_CHECK_T(ValueError, std::isfinite(s.scale) && s.scale > 0,
             "{} at '{}' on CUDA: softmax_scale must be positive and finite, found {}", op, n.scope,
             s.scale);
  MT_CHECK_T(ValueError,
             s.seq < INT_MAX && s.batch * s.heads_q < INT_MAX && s.batch * s.heads_kv < INT_MAX,
             "{} at '{}' on CUDA: extents must fit 32-bit grids, found batch {} seq {} heads {}",
             op, n.scope, s.batch, s.seq, s.heads_q);
  if (dtype == DType::kBF16 && has_tensor_core_kernel(s)) return;
  if (dtype == DType::kBF16 || dtype == DType::kF32 || dtype == DType::kF64) {
    MT_CHECK_T(ValueError, s.dim_qk <= kAttentionSimpleMaxDim && s.dim_v <= kAttentionSimpleMaxDim,
               "{} at '{}' on CUDA: {} head dims (Dqk {}, Dv {}) need the CUDA-core kernel, "
               "which supports head dims up to {}; bfloat16 tensor-core kernels exist for "
               "(Dqk, Dv) in {}",
               op, n.scope, dtype_name(dtype), s.dim_qk, s.dim_v, kAttentionSimpleMaxDim,
               kTensorCoreDims);
    if (dtype == DType::kBF16)
      log_warn(
          "{} at '{}' on CUDA: no bfloat16 tensor-core kernel for head dims (Dqk {}, Dv {}) "
          "(compiled: {}); running the CUDA-core kernel, which is correct but far slower",
          op, n.scope, s.dim_qk, s.dim_v, kTensorCoreDims);
  } else {
    MT_THROW(ValueError, "{} at '{}' on CUDA: expected bfloat16, float32 or float64, found {}", op,
             n.scope, dtype_name(dtype));
  }
}

const AttentionLibrary* g_library = nullptr;  // set at static initialisation, read after

// Whether the node runs on the attention library. kAuto falls back to meshtrain's kernels, with
// one warning per shape, when the library refuses the shape; kCudnn makes that an error naming
// the node. The library caches its plans, so asking again at the factory is cheap.
bool use_library(const AttnShape& s, DType dtype, ops::AttentionKernel kernel, bool backward,
                 const std::string& scope) {
  if (kernel == ops::AttentionKernel::kMeshtrain || dtype != DType::kBF16) return false;
  if (!g_library) {
    MT_CHECK_T(ValueError, kernel != ops::AttentionKernel::kCudnn,
               "attention at '{}': [model] attention_backend = \"cudnn\", but this build has no "
               "cuDNN (configure found none); use \"auto\" or \"meshtrain\"",
               scope);
    return false;
  }
  try {
    backward ? g_library->bwd_workspace(s) : g_library->fwd_workspace(s);
    return true;
  } catch (const Error& e) {
    MT_CHECK_T(ValueError, kernel != ops::AttentionKernel::kCudnn,
               "attention at '{}': [model] attention_backend = \"cudnn\", but {} refuses this "
               "node: {}; use \"auto\" (meshtrain's kernels where {} cannot) or \"meshtrain\"",
               scope, g_library->name, e.what(), g_library->name);
    static std::mutex mutex;
    static std::set<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>> warned;
    std::lock_guard<std::mutex> lock(mutex);
    if (warned.emplace(backward, s.batch, s.seq, s.heads_q, s.heads_kv, s.dim_qk, s.dim_v).second)
      log_warn(
          "attention at '{}': {} refuses the {} (batch {} seq {} heads {}/{} dims {}/{}): {}; "
          "running meshtrain's kernels",
          scope, g_library->name, backward ? "backward" : "forward", s.batch, s.seq, s.heads_q,
          s.heads_kv, s.dim_qk, s.dim_v, e.what());
    return false;
  }
}

cudaStream_t stream_of(const KernelContext& c) {
  return static_cast<cudaStream_t>(c.stream->native_handle());
}

// cp.async and the 16-byte epilogue stores need 16-byte aligned rows; the memory plan aligns
// buffers to 256 bytes, so only an odd view could trip this.
void check_aligned16(const KernelContext& c) {
  auto check = [&](const Tensor& t, const char* what, size_t i) {
    MT_CHECK_T(ValueError, reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0,
               "{} at '{}' on CUDA (bfloat16): {} {} is not 16-byte aligned (address {})",
               c.node->op, c.node->scope, what, i, t.raw());
  };
  for (size_t i = 0; i < c.in.size(); ++i) check(c.in[i], "input", i);
  for (size_t i = 0; i < c.out.size(); ++i) check(c.out[i], "output", i);
}

KernelFn make_attention(const Node& n, const Graph& g) {
  const AttnShape s = shape_of(n, g);
  const DType dtype = g.value(n.inputs.at(0)).meta.dtype;
  check_supported(n, dtype, s);
  if (s.batch * s.seq * s.heads_q > 0 &&
      use_library(s, dtype, ops::attention_kernel_of(n.attrs), false, n.scope))
    return [s, lib = g_library](KernelContext& c) {
      check_aligned16(c);
      lib->fwd(s, c.in[0].raw(), c.in[1].raw(), c.in[2].raw(), c.out[0].raw(),
               static_cast<float*>(c.out[1].raw()),
               c.workspace.defined() ? c.workspace.raw() : nullptr,
               c.workspace.defined() ? c.workspace.nbytes() : 0, stream_of(c));
    };
  if (dtype == DType::kBF16 && !has_tensor_core_kernel(s))
    return [s](KernelContext& c) {
      attention_fwd_simple_bf16(s, c.in[0].raw(), c.in[1].raw(), c.in[2].raw(), c.out[0].raw(),
                                c.out[1].data<float>(), stream_of(c));
    };
  if (dtype == DType::kBF16) {
    // On Hopper the TMA/wgmma forward takes the head dims it has (decided here, once); the
    // mma.sync kernels run everything else. Both write the out and lse the backward reads.
    const bool sm90 = attention_fwd_bf16_sm90_supports(s);
    return [s, sm90](KernelContext& c) {
      check_aligned16(c);
      const void *q = c.in[0].raw(), *k = c.in[1].raw(), *v = c.in[2].raw();
      float* lse = static_cast<float*>(c.out[1].raw());
      const bool ran =
          (sm90 && attention_fwd_bf16_sm90(s, q, k, v, c.out[0].raw(), lse, stream_of(c))) ||
          attention_fwd_bf16(s, q, k, v, c.out[0].raw(), lse, stream_of(c));
      MT_CHECK(ran, "attention bf16: no kernel for ({}, {}) after prepare checked it", s.dim_qk,
               s.dim_v);
    };
  }
  if (dtype == DType::kF32)
    return [s](KernelContext& c) {
      attention_fwd_simple<float>(s, c.in[0].data<float>(), c.in[1].data<float>(),
                                  c.in[2].data<float>(), c.out[0].data<float>(),
                                  c.out[1].data<float>(), stream_of(c));
    };
  return [s](KernelContext& c) {
    attention_fwd_simple<double>(s, c.in[0].data<double>(), c.in[1].data<double>(),
                                 c.in[2].data<double>(), c.out[0].data<double>(),
                                 c.out[1].data<double>(), stream_of(c));
  };
}

KernelFn make_attention_backward(const Node& n, const Graph& g) {
  const AttnShape s = shape_of(n, g);
  const DType dtype = g.value(n.inputs.at(0)).meta.dtype;
  check_supported(n, dtype, s);
  if (s.batch * s.seq * s.heads_q > 0 &&
      use_library(s, dtype, ops::attention_kernel_of(n.attrs), true, n.scope))
    return [s, lib = g_library](KernelContext& c) {
      check_aligned16(c);
      const auto& in = c.in;
      const auto& out = c.out;
      lib->bwd(s, in[0].raw(), in[1].raw(), in[2].raw(), in[3].raw(), in[4].data<float>(),
               in[5].raw(), out[0].raw(), out[1].raw(), out[2].raw(),
               c.workspace.defined() ? c.workspace.raw() : nullptr,
               c.workspace.defined() ? c.workspace.nbytes() : 0, stream_of(c));
    };
  // delta (rowsum(dout * out)) lives in the node's workspace (backward_workspace below).
  const size_t delta_bytes =
      size_t(s.batch * s.heads_q * s.seq) * (dtype == DType::kF64 ? sizeof(double) : sizeof(float));
  // On Hopper the TMA/wgmma backward (its deterministic default, which needs only the same delta
  // workspace) takes the head dims it has; the mma.sync kernels run everything else.
  const bool sm90 = dtype == DType::kBF16 && attention_bwd_bf16_sm90_supports(s);
  return [s, dtype, delta_bytes, sm90](KernelContext& c) {
    if (s.batch * s.seq == 0) return;  // every output is empty
    if (s.heads_q == 0) {              // no query heads: dk and dv are zero (and dq is empty)
      CUDA_CHECK(cudaMemsetAsync(c.out[1].raw(), 0, c.out[1].nbytes(), stream_of(c)));
      CUDA_CHECK(cudaMemsetAsync(c.out[2].raw(), 0, c.out[2].nbytes(), stream_of(c)));
      return;
    }
    MT_CHECK(c.workspace.defined() && c.workspace.nbytes() >= delta_bytes,
             "attention_backward at '{}': workspace of {} bytes, expected >= {}", c.node->scope,
             c.workspace.defined() ? c.workspace.nbytes() : 0, delta_bytes);
    const auto& in = c.in;
    const auto& out = c.out;
    if (dtype == DType::kBF16 && !has_tensor_core_kernel(s)) {
      attention_bwd_simple_bf16(s, in[0].raw(), in[1].raw(), in[2].raw(), in[3].raw(),
                                in[4].data<float>(), in[5].raw(), out[0].raw(), out[1].raw(),
                                out[2].raw(), static_cast<float*>(c.workspace.raw()), stream_of(c));
    } else if (dtype == DType::kBF16) {
      check_aligned16(c);
      float* ws = static_cast<float*>(c.workspace.raw());
      const bool ran =
          (sm90 && attention_bwd_bf16_sm90(s, in[0].raw(), in[1].raw(), in[2].raw(), in[3].raw(),
                                           in[4].data<float>(), in[5].raw(), out[0].raw(),
                                           out[1].raw(), out[2].raw(), ws, stream_of(c))) ||
          attention_bwd_bf16(s, in[0].raw(), in[1].raw(), in[2].raw(), in[3].raw(),
                             in[4].data<float>(), in[5].raw(), out[0].raw(), out[1].raw(),
                             out[2].raw(), ws, stream_of(c));
      MT_CHECK(ran, "attention_backward bf16: no kernel for ({}, {}) after prepare checked it",
               s.dim_qk, s.dim_v);
    } else if (dtype == DType::kF32) {
      attention_bwd_simple<float>(s, in[0].data<float>(), in[1].data<float>(), in[2].data<float>(),
                                  in[3].data<float>(), in[4].data<float>(), in[5].data<float>(),
                                  out[0].data<float>(), out[1].data<float>(), out[2].data<float>(),
                                  static_cast<float*>(c.workspace.raw()), stream_of(c));
    } else {
      attention_bwd_simple<double>(
          s, in[0].data<double>(), in[1].data<double>(), in[2].data<double>(), in[3].data<double>(),
          in[4].data<double>(), in[5].data<double>(), out[0].data<double>(), out[1].data<double>(),
          out[2].data<double>(), static_cast<double*>(c.workspace.raw()), stream_of(c));
    }
  };
}

// The library's scratch when the node runs on it, else 0. Asked while the memory plan is made;
// with no GPU to build a plan on (`meshtrain plan` for a CUDA layout on a CPU-only machine), the
// library refuses and the plan counts meshtrain's kernels' scratch instead.
size_t library_workspace(const std::vector<TensorMeta>& in, const Attrs& a, bool backward) {
  const AttnShape s = shape_of(in, a);
  if (s.batch * s.seq * s.heads_q == 0 ||
      !use_library(s, in.at(0).dtype, ops::attention_kernel_of(a), backward, "(memory plan)"))
    return 0;
  return backward ? g_library->bwd_workspace(s) : g_library->fwd_workspace(s);
}

size_t forward_workspace(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&,
                         const Attrs& a) {
  return library_workspace(in, a, false);
}

// Backward scratch: the library's, or meshtrain's delta = rowsum(dout * out) per (batch, q head,
// row) in the accumulation type (fp32 for bf16/fp32, fp64 for fp64).
size_t backward_workspace(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&,
                          const Attrs& a) {
  const TensorMeta& q = in.at(0);
  const size_t elem = q.dtype == DType::kF64 ? sizeof(double) : sizeof(float);
  const size_t delta = size_t(q.shape[0] * q.shape[2] * q.shape[1]) * elem;
  return std::max(delta, library_workspace(in, a, true));
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory("attention", DeviceType::kCUDA, make_attention,
                                            forward_workspace);
  OpRegistry::instance().add_kernel_factory("attention_backward", DeviceType::kCUDA,
                                            make_attention_backward, backward_workspace);
}

}  // namespace

void register_attention_library(const AttentionLibrary* library) { g_library = library; }
const AttentionLibrary* attention_library() { return g_library; }
}  // namespace meshtrain::cuda
