// CUDA router kernels: one warp per token, computing in float64 like the CPU kernel so the chosen
// experts are the CPU's (higher biased score first, lower id on ties; group limiting by the sum
// of each group's two best biased scores, lower group id on ties). The per-warp scores, biased
// scores and group scores live in shared memory; each choice is a warp-wide argmax with the CPU's
// tie rule, repeated k times. The backward recomputes the scores from the logits, as the CPU one.
#include <climits>
#include <cmath>

#include "meshtrain/moe/router.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

struct RouterParams {
  int64_t tokens = 0, e = 0, k = 0, groups = 0, limited = 0;
  bool softmax = true, route_norm = false;
  double route_scale = 1.0;
  int64_t smem_doubles = 0;  // shared memory per warp, in doubles
};

RouterParams params_of(const KernelContext& c, const ops::RouterConfig& cfg) {
  RouterParams p;
  p.tokens = c.in[0].shape()[0];
  p.e = c.in[0].shape()[1];
  p.k = cfg.top_k;
  p.groups = cfg.num_expert_groups;
  p.limited = cfg.num_limited_groups;
  p.softmax = cfg.score_func == "softmax";
  p.route_norm = cfg.route_norm;
  p.route_scale = cfg.route_scale;
  return p;
}

// scores[i] for i in [0, e) of one token into shared memory (every lane sees them afterwards).
template <typename T>
__device__ void token_scores(const T* __restrict__ logits, int64_t e, bool softmax,
                             double* scores) {
  const int lane = threadIdx.x & 31;
  if (softmax) {
    double m = -INFINITY;
    for (int64_t i = lane; i < e; i += 32) m = fmax(m, double(logits[i]));
    m = warp_max(m);
    double sum = 0;
    for (int64_t i = lane; i < e; i += 32) {
      const double v = exp(double(logits[i]) - m);
      scores[i] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int64_t i = lane; i < e; i += 32) scores[i] /= sum;
  } else {
    for (int64_t i = lane; i < e; i += 32) scores[i] = 1.0 / (1.0 + exp(-double(logits[i])));
  }
  __syncwarp();
}

// Better of (va, ia) and (vb, ib): higher value, lower index on ties.
__device__ __forceinline__ bool better(double va, int ia, double vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Index of the best of value[0, n) over the warp, NaN entries (taken ones) skipped; every lane
// gets it.
__device__ int warp_argmax(const double* value, int64_t n) {
  const int lane = threadIdx.x & 31;
  double bv = -INFINITY;
  int bi = INT_MAX;
  for (int64_t i = lane; i < n; i += 32)
    if (!isnan(value[i]) && (bi == INT_MAX || better(value[i], int(i), bv, bi))) {
      bv = value[i];
      bi = int(i);
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi != INT_MAX && (bi == INT_MAX || better(ov, oi, bv, bi))) {
      bv = ov;
      bi = oi;
    }
  }
  return bi;
}

// Shared memory per warp: scores [e], choice [e], group [groups] (doubles), then order [k] int32.
size_t router_smem_per_warp(const RouterParams& p) {
  return size_t(2 * p.e + p.groups) * sizeof(double) + size_t(p.k) * sizeof(int32_t);
}

template <typename T>
__global__ void router_kernel(const T* __restrict__ logits, const T* __restrict__ bias,
                              int32_t* __restrict__ ids, T* __restrict__ weights, RouterParams p) {
  extern __shared__ double smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double* scores = smem + warp * p.smem_doubles;
  double* choice = scores + p.e;
  double* group = choice + p.e;
  int32_t* order = reinterpret_cast<int32_t*>(group + p.groups);
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.tokens) return;
  const T* lt = logits + t * p.e;
  for (int64_t i = lane; i < p.e; i += 32)
    MT_DEVICE_CHECK(isfinite(double(lt[i])), "router: a gate logit is not finite (diverged?)");
  token_scores(lt, p.e, p.softmax, scores);
  for (int64_t i = lane; i < p.e; i += 32) choice[i] = scores[i] + double(bias[i]);
  __syncwarp();
  if (p.groups > 0) {
    const int64_t per = p.e / p.groups;
    for (int64_t g = lane; g < p.groups; g += 32) {
      double top1 = -INFINITY, top2 = -INFINITY;
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        const double v = choice[i];
        if (v > top1) {
          top2 = top1;
          top1 = v;
        } else if (v > top2) {
          top2 = v;
        }
      }
      group[g] = top1 + top2;
    }
    __syncwarp();
    // Take the best `limited` groups (marked NaN once taken), then mask every expert of the
    // groups left.
    for (int64_t j = 0; j < p.limited; ++j) {
      const int best = warp_argmax(group, p.groups);
      __syncwarp();
      if (lane == 0) group[best] = NAN;
      __syncwarp();
    }
    for (int64_t g = 0; g < p.groups; ++g) {
      if (!isnan(group[g]))
        for (int64_t i = g * per + lane; i < (g + 1) * per; i += 32) choice[i] = -INFINITY;
    }
    __syncwarp();
  }
  for (int64_t j = 0; j < p.k; ++j) {
    const int best = warp_argmax(choice, p.e);
    __syncwarp();
    if (lane == 0) {
      order[j] = best;
      choice[best] = NAN;  // taken
    }
    __syncwarp();
  }
  if (lane == 0) {
    double sum = 0;
    for (int64_t j = 0; j < p.k; ++j) sum += scores[order[j]];
    const double norm = p.route_norm ? 1.0 / (sum + 1e-20) : 1.0;
    for (int64_t j = 0; j < p.k; ++j) {
      ids[t * p.k + j] = order[j];
      weights[t * p.k + j] = T(scores[order[j]] * norm * p.route_scale);
    }
  }
}

// w_j = scale · u_j / N with u_j = s[id_j], N = Σu + 1e-20 (1 without route_norm); ds scatters
// du_j; softmax: dl = s (ds − <s, ds>); sigmoid: dl = ds · s (1 − s). Shared memory per warp:
// scores [e] and ds [e].
template <typename T>
__global__ void router_backward_kernel(const T* __restrict__ logits,
                                       const int32_t* __restrict__ ids, const T* __restrict__ dw,
                                       T* __restrict__ dl, RouterParams p) {
  extern __shared__ double smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double* scores = smem + warp * p.smem_doubles;
  double* ds = scores + p.e;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.tokens) return;
  token_scores(logits + t * p.e, p.e, p.softmax, scores);
  for (int64_t i = lane; i < p.e; i += 32) ds[i] = 0.0;
  __syncwarp();
  const int32_t* id = ids + t * p.k;
  const T* g = dw + t * p.k;
  if (lane == 0) {
    if (p.route_norm) {
      double sum = 0, gu = 0;
      for (int64_t j = 0; j < p.k; ++j) {
        sum += scores[id[j]];
        gu += double(g[j]) * scores[id[j]];
      }
      const double n = sum + 1e-20;
      for (int64_t j = 0; j < p.k; ++j)
        ds[id[j]] += p.route_scale * (double(g[j]) / n - gu / (n * n));
    } else {
      for (int64_t j = 0; j < p.k; ++j) ds[id[j]] += p.route_scale * double(g[j]);
    }
  }
  __syncwarp();
  T* out = dl + t * p.e;
  if (p.softmax) {
    double dot = 0;
    for (int64_t i = lane; i < p.e; i += 32) dot += scores[i] * ds[i];
    dot = warp_sum(dot);
    for (int64_t i = lane; i < p.e; i += 32) out[i] = T(scores[i] * (ds[i] - dot));
  } else {
    for (int64_t i = lane; i < p.e; i += 32) out[i] = T(ds[i] * scores[i] * (1.0 - scores[i]));
  }
}

template <typename Kernel>
void launch_router(Kernel kernel, const RouterParams& p, cudaStream_t s, const char* what,
                   auto&&... args) {
  if (p.tokens == 0) return;
  const size_t smem = size_t(kWarpsPerBlock) * size_t(p.smem_doubles) * sizeof(double);
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const unsigned blocks = unsigned((p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  kernel<<<blocks, kWarpsPerBlock * 32, smem, s>>>(args..., p);
  CUDA_CHECK_LAUNCH(what);
}

// The router computes in float32 or float64 logits only (moe/router.cpp checks it too).
template <typename F>
void dispatch_router_dtype(DType dt, const char* what, F&& run) {
  if (dt == DType::kF32)
    run(static_cast<float*>(nullptr));
  else if (dt == DType::kF64)
    run(static_cast<double*>(nullptr));
  else
    MT_THROW(ValueError, "{} (cuda): logits must be float32 or float64, found {}", what,
             dtype_name(dt));
}

KernelFn make_router(const Node& node, const Graph&) {
  ops::RouterConfig cfg = ops::router_config_from_attrs(node.attrs);
  return [cfg](KernelContext& c) {
    RouterParams p = params_of(c, cfg);
    p.smem_doubles = int64_t((router_smem_per_warp(p) + 7) / 8);
    auto run = [&]<typename T>(T*) {
      launch_router(router_kernel<T>, p, stream_of(c), "router", in_ptr<T>(c, 0), in_ptr<T>(c, 1),
                    out_ptr<int32_t>(c, 0), out_ptr<T>(c, 1));
    };
    dispatch_router_dtype(c.in[0].dtype(), "router", run);
  };
}

KernelFn make_router_backward(const Node& node, const Graph&) {
  ops::RouterConfig cfg = ops::router_config_from_attrs(node.attrs);
  return [cfg](KernelContext& c) {
    RouterParams p = params_of(c, cfg);
    p.smem_doubles = 2 * p.e;
    auto run = [&]<typename T>(T*) {
      launch_router(router_backward_kernel<T>, p, stream_of(c), "router_backward", in_ptr<T>(c, 0),
                    in_ptr<int32_t>(c, 1), in_ptr<T>(c, 2), out_ptr<T>(c, 0));
    };
    dispatch_router_dtype(c.in[0].dtype(), "router_backward", run);
  };
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory("router", DeviceType::kCUDA, make_router);
  OpRegistry::instance().add_kernel_factory("router_backward", DeviceType::kCUDA,
                                            make_router_backward);
}

}  // namespace
}  // namespace meshtrain::cuda
