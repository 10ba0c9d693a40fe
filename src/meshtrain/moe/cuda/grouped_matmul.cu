// CUDA grouped GEMMs of the routed experts: one cuBLASLt GEMM per non-empty expert on its group's
// rows (bf16 operands with fp32 accumulation, exact fp32 with CUBLAS_COMPUTE_32F — never TF32 —,
// fp64) with an algorithm chosen before the first step for the expert's row count (expert_gemm.h),
// spread over a few streams so several experts' tiles share the GPU; one small kernel
// writes zeros into the rows outside every group (padding and slack), so no memset of the whole
// buffer. grouped_matmul_wgrad zeroes only the experts that received no rows; its accumulating
// form (grouped_matmul_wgrad_accumulate) writes the float32 gradient itself, beta 0 when it
// overwrites (zeroing empty experts) and 1 after (leaving them).
//
// With [model] expert_gemm_backend = "meshtrain", bf16 GEMMs whose rows are 16-byte multiples run
// meshtrain's persistent Hopper grouped GEMM instead (grouped_gemm_sm90.h: one launch, the groups
// read on the device, no host wait); the node's "kernel" attr ([model] expert_gemm_backend) can
// insist on either path.
//
// Host sync (the cuBLASLt path): cuBLAS takes each GEMM's extents on the host, and the group counts
// are data (the router's choices of this step). When the groups come from moe_dispatch_plan, the
// plan has published a pinned copy (plan_groups.h) and the host waits for that plan's event only:
// the GPU keeps running what was queued after the plan, and in backward the event is long done. The
// expert-parallel exchange's local groups are built on the host by ep_counts at its host sync
// point and published there (moe/host_counts.h): read with no copy and no wait. Groups made
// elsewhere are copied here with a sync of the node's stream. A device-side grouped kernel that
// reads the groups itself is the way to remove the remaining wait.
#include <cublas_v2.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "meshtrain/moe/cuda/expert_gemm.h"
#include "meshtrain/moe/cuda/grouped_gemm_sm90.h"
#include "meshtrain/moe/cuda/plan_groups.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/moe/host_counts.h"
#include "meshtrain/ops/cuda/cublaslt_matmul.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

// Zeroes the rows of y [rows, n] outside every group: blocks (b < E, ·) clear the gap between the
// end of expert b − 1's group and the start of expert b's, blocks (E, ·) the slack after the last
// group; the grid's y dimension splits a long gap.
template <typename T>
__global__ void zero_outside_groups_kernel(const int32_t* __restrict__ g, int64_t e, int64_t rows,
                                           int64_t n, T* __restrict__ y) {
  const int64_t b = blockIdx.x;
  const int64_t from = b == 0 ? 0 : int64_t(g[b - 1]) + int64_t(g[e + b - 1]);
  const int64_t to = b == e ? rows : int64_t(g[b]);
  const int64_t stride = int64_t(blockDim.x) * gridDim.y;
  for (int64_t i = from * n + blockIdx.y * blockDim.x + threadIdx.x; i < to * n; i += stride)
    y[i] = T(0);
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF64: return CUDA_R_64F;
    default:
      MT_THROW(ValueError, "grouped GEMM on CUDA: expected bfloat16, float32 or float64, found {}",
               dtype_name(d));
  }
}

// Expert GEMMs run on kSlots streams forked from the node's stream, so that the tiles of several
// experts share the GPU (one expert's GEMM of ~1.5k rows fills only part of it); each slot has its
// own cuBLAS handle and its own slice of the node's workspace. Experts go to the slot with the
// fewest rows so far (lower slot on ties): a fixed function of the counts, so runs repeat.
constexpr int kSlots = 4;

struct SlotStreams {
  cudaStream_t stream[kSlots] = {};
  cublasHandle_t handle[kSlots] = {};
};

// Per device, made when the first grouped GEMM is prepared and never destroyed (as the cuBLAS
// handles: the context may be gone before static destructors run).
const SlotStreams& slot_streams(int device) {
  static std::mutex mu;
  static std::map<int, SlotStreams*> all;
  std::lock_guard<std::mutex> lock(mu);
  auto it = all.find(device);
  if (it != all.end()) return *it->second;
  auto* s = new SlotStreams;
  int priority_low = 0, priority_high = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
  for (int i = 0; i < kSlots; ++i) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&s->stream[i], cudaStreamNonBlocking, priority_low));
    CUBLAS_CHECK(cublasCreate(&s->handle[i]));
    CUBLAS_CHECK(cublasSetMathMode(
        s->handle[i],
        cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    CUBLAS_CHECK(cublasSetStream(s->handle[i], s->stream[i]));
  }
  all.emplace(device, s);
  return *s;
}

// Per-node state made at prepare time: where the host gets the groups, the fork/join events.
struct GroupedState {
  int device = 0;
  int64_t experts = 0;
  DType dtype = DType::kF32;
  std::shared_ptr<HostGroups> published;        // the plan's copy, or null: read here, with a sync
  std::shared_ptr<ops::HostPublished> on_host;  // built on the host by the EP exchange
  int32_t* own = nullptr;                       // pinned [2, E] when not published
  const SlotStreams* slots = nullptr;
  std::unique_ptr<ExpertGemm> lt;  // the expert GEMM; null when an extent is 0 (no GEMM runs)
  char* slot_ws = nullptr;         // this launch's workspace, kSlots slices of slot_ws_bytes
  size_t slot_ws_bytes = 0;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join[kSlots] = {};
  int64_t slot_rows[kSlots] = {};
  bool slot_used[kSlots] = {};

  // `shape`: the expert GEMM with its varying extent at the maximum (every routed row).
  GroupedState(const Graph& graph, ValueId groups, int64_t e, DType dt,
               const ExpertGemmShape& shape)
      : experts(e), dtype(dt) {
    CUDA_CHECK(cudaGetDevice(&device));
    if (shape.m > 0 && shape.n > 0 && shape.k > 0)
      lt = std::make_unique<ExpertGemm>(device, shape, kGemmWorkspaceBytes / kSlots);
    if (groups_published(graph, groups))
      published = host_groups_of(graph, groups, e);
    else if (ops::host_published_by_producer(graph, groups))
      on_host = ops::host_published_of(graph, groups);
    else
      CUDA_CHECK(
          cudaMallocHost(reinterpret_cast<void**>(&own), size_t(2 * std::max<int64_t>(e, 1)) * 4));
    slots = &slot_streams(device);
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (auto& ev : join) CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  ~GroupedState() {
    if (own) cudaFreeHost(own);
    cudaEventDestroy(fork);
    for (auto& ev : join) cudaEventDestroy(ev);
  }
  GroupedState(const GroupedState&) = delete;
  GroupedState& operator=(const GroupedState&) = delete;

  // The groups on the host, checked against the buffer's rows. Host sync: see the file comment.
  const int32_t* host_groups(KernelContext& c, const Tensor& groups, int64_t rows, const char* op) {
    const int32_t* g = nullptr;
    if (published) {
      CUDA_CHECK(cudaEventSynchronize(published->ready));  // waits for the plan only
      g = published->pinned;
    } else if (on_host) {
      // Written by ep_counts after its host sync, earlier in the schedule: nothing to wait for.
      MT_CHECK(on_host->data != nullptr && on_host->count == 2 * experts,
               "{}: the exchange's host groups are not published ({} of {} counts)", op,
               on_host->count, 2 * experts);
      g = on_host->data;
    } else {
      cudaStream_t s = stream_of(c);
      CUDA_CHECK(
          cudaMemcpyAsync(own, groups.raw(), size_t(2 * experts) * 4, cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));  // groups made by an exchange op: see the file comment
      g = own;
    }
    ops::check_group_rows(g, experts, rows, op);
    return g;
  }

  // Starts a launch's expert GEMMs: forks the slots off the node's stream and hands each its
  // slice of the workspace.
  void fork_slots(KernelContext& c) {
    CUDA_CHECK(cudaEventRecord(fork, stream_of(c)));
    const size_t total = c.workspace.defined() ? c.workspace.nbytes() : 0;
    const size_t slice = total / kSlots / 256 * 256;
    char* ws = c.workspace.defined() ? static_cast<char*>(c.workspace.raw()) : nullptr;
    slot_ws = ws;
    slot_ws_bytes = ws ? slice : 0;
    for (int i = 0; i < kSlots; ++i) {
      slot_rows[i] = 0;
      slot_used[i] = false;
      CUBLAS_CHECK(cublasSetWorkspace(slots->handle[i], ws ? ws + size_t(i) * slice : nullptr,
                                      ws ? slice : 0));
    }
  }
  // The slot for the next expert of `rows` rows (waits on the fork the first time it is used).
  int pick_slot(int64_t rows) {
    int best = 0;
    for (int i = 1; i < kSlots; ++i)
      if (slot_rows[i] < slot_rows[best]) best = i;
    slot_rows[best] += rows;
    if (!slot_used[best]) {
      CUDA_CHECK(cudaStreamWaitEvent(slots->stream[best], fork, 0));
      slot_used[best] = true;
    }
    return best;
  }
  // Ends a launch's expert GEMMs: the node's stream waits for every slot that ran one.
  void join_slots(KernelContext& c) {
    for (int i = 0; i < kSlots; ++i) {
      if (!slot_used[i]) continue;
      CUDA_CHECK(cudaEventRecord(join[i], slots->stream[i]));
      CUDA_CHECK(cudaStreamWaitEvent(stream_of(c), join[i], 0));
    }
  }

  // Column-major C = op(A) op(B) with beta 0 for `rows` routed rows (the varying extent of `lt`:
  // n for grouped_matmul, k for the wgrad; the other extents and the transposes are `lt`'s), on
  // the least loaded slot.
  void expert_gemm(int64_t rows, const void* a, const void* b, void* c) {
    // lt is null only when an extent is 0, and then no launch reaches a GEMM.
    MT_CHECK(lt != nullptr, "grouped GEMM: expert GEMM of {} rows without a plan", rows);
    const int slot = pick_slot(rows);
    lt->run(rows, a, b, c, slot_ws ? slot_ws + size_t(slot) * slot_ws_bytes : nullptr,
            slot_ws_bytes, slots->stream[slot], slots->handle[slot]);
  }
};

template <typename T>
void zero_outside(const Tensor& groups, int64_t e, int64_t rows, int64_t n, void* y,
                  cudaStream_t s) {
  zero_outside_groups_kernel<T><<<dim3(unsigned(e + 1), 16), 256, 0, s>>>(
      static_cast<const int32_t*>(groups.raw()), e, rows, n, static_cast<T*>(y));
  CUDA_CHECK_LAUNCH("grouped_matmul_zero_outside_groups");
}

void launch_zero_outside(DType dt, const Tensor& groups, int64_t e, int64_t rows, int64_t n,
                         void* y, cudaStream_t s) {
  switch (dt) {
    case DType::kBF16: return zero_outside<bf16>(groups, e, rows, n, y, s);
    case DType::kF32: return zero_outside<float>(groups, e, rows, n, y, s);
    case DType::kF64: return zero_outside<double>(groups, e, rows, n, y, s);
    default: cuda_type(dt);  // throws
  }
}

// "auto" takes the Hopper kernel where it measured faster than the per-expert cuBLASLt path:
// 2.4-2.9x (forward, data gradient) and 1.6x (weight gradient) at a mean of 384 rows per expert
// (one launch against 64 small GEMMs), while at 1,536 the per-expert cuBLASLt GEMMs lead by
// 4-14% (bench/kernels/NOTES.md, 2026-12-07, H100). The switch sits at 768, between the two
// measured points; "meshtrain" takes the kernel at any size.
constexpr int64_t kAutoSm90MaxRowsPerExpert = 768;

// Whether a node runs the Hopper grouped GEMM: bf16, the device and extents it takes, and the
// node's kernel choice (kMeshtrain insists: an error naming the node where it cannot run). `rows`:
// the routed rows of the node's buffers, all experts together.
bool use_sm90(const Node& node, DType dtype, int64_t experts, int64_t n, int64_t k, int64_t rows) {
  const ops::ExpertGemmKernel want = ops::expert_gemm_kernel_of(node.attrs);
  if (want == ops::ExpertGemmKernel::kCublas) return false;
  const bool can = dtype == DType::kBF16 && grouped_gemm_sm90_supports(experts, n, k);
  MT_CHECK(can || want != ops::ExpertGemmKernel::kMeshtrain,
           "{} at '{}': [model] expert_gemm_backend = \"meshtrain\", but its Hopper grouped GEMM "
           "cannot run here (it needs a compute capability 9.0 GPU, bfloat16 operands, at most {} "
           "experts and extents that are multiples of 8; found {}, {} experts, extents {} and {}); "
           "use \"auto\" or \"cublas\"",
           node.op, node.scope, kGroupedSm90MaxExperts, dtype_name(dtype), experts, n, k);
  if (want == ops::ExpertGemmKernel::kAuto)
    return can && rows <= kAutoSm90MaxRowsPerExpert * experts;
  return can;
}

// The expert GEMMs as the launches below call them, column-major, at the largest extent (every
// routed row in one expert). grouped_matmul: y_eᵀ[n, count] = op(w_e)ᵀ · x_eᵀ[k, count], w being
// [E, n, k] (tw) or [E, k, n].
ExpertGemmShape gmm_shape(const TensorMeta& x, const TensorMeta& w, bool tw) {
  const int64_t rows = x.shape[0], k = x.shape[1], n = tw ? w.shape[1] : w.shape[2];
  return {.dtype = x.dtype,
          .ta = tw,
          .tb = false,
          .m = n,
          .n = rows,
          .k = k,
          .lda = tw ? k : n,
          .ldb = k,
          .ldc = n,
          .vary_k = false};
}
// grouped_matmul_wgrad: out_eᵀ[q, p] = b_eᵀ[q, count] · a_e[count, p].
ExpertGemmShape wgrad_shape(const TensorMeta& a, const TensorMeta& b) {
  const int64_t rows = a.shape[0], p = a.shape[1], q = b.shape[1];
  return {.dtype = a.dtype,
          .ta = false,
          .tb = true,
          .m = q,
          .n = p,
          .k = rows,
          .lda = q,
          .ldb = p,
          .ldc = q,
          .vary_k = true};
}

KernelFn make_grouped_matmul(const Node& node, const Graph& graph) {
  const TensorMeta& xm = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& wm = graph.value(node.inputs.at(1)).meta;
  cuda_type(xm.dtype);
  const bool tw = node.attrs.b("transpose_w");
  const int64_t experts = wm.shape[0], wn = tw ? wm.shape[1] : wm.shape[2];
  if (use_sm90(node, xm.dtype, experts, wn, xm.shape[1], xm.shape[0]))
    return [experts, tw](KernelContext& c) {
      const int64_t rows = c.in[0].shape()[0], k = c.in[0].shape()[1], n = c.out[0].shape()[1];
      if (n > 0)
        launch_zero_outside(DType::kBF16, c.in[2], experts, rows, n, c.out[0].raw(), stream_of(c));
      const GroupedGemmSm90 g{c.in[0].raw(),
                              c.in[1].raw(),
                              c.out[0].raw(),
                              static_cast<const int32_t*>(c.in[2].raw()),
                              experts,
                              rows,
                              n,
                              k,
                              tw};
      MT_CHECK(grouped_gemm_sm90(g, stream_of(c)),
               "grouped_matmul at '{}': the Hopper grouped GEMM refused [{}, {}] x {} experts "
               "after prepare took it (a buffer not 16-byte aligned?)",
               c.node->scope, rows, k, experts);
    };
  auto st = std::make_shared<GroupedState>(graph, node.inputs.at(2), experts, xm.dtype,
                                           gmm_shape(xm, wm, tw));
  return [st, tw](KernelContext& c) {
    const int64_t rows = c.in[0].shape()[0], k = c.in[0].shape()[1];
    const int64_t e = st->experts, n = c.out[0].shape()[1];
    const size_t elem = dtype_size(st->dtype);
    const int32_t* g = st->host_groups(c, c.in[2], rows, "grouped_matmul");
    if (n > 0) launch_zero_outside(st->dtype, c.in[2], e, rows, n, c.out[0].raw(), stream_of(c));
    st->fork_slots(c);
    const char* x = static_cast<const char*>(c.in[0].raw());
    const char* w = static_cast<const char*>(c.in[1].raw());
    char* y = static_cast<char*>(c.out[0].raw());
    for (int64_t ex = 0; ex < e; ++ex) {
      const int64_t start = g[ex], count = g[e + ex];
      if (count == 0 || n == 0) continue;
      // Row-major y_e[count, n] = x_e[count, k] · op(w_e); column-major: y_eᵀ = op(w_e)ᵀ x_eᵀ.
      // w_e is [n, k] (tw: y = x wᵀ, cuBLAS A = w_e transposed, lda k) or [k, n] (lda n).
      const char* we = w + size_t(ex * n * k) * elem;
      if (k == 0) {
        CUDA_CHECK(cudaMemsetAsync(y + size_t(start * n) * elem, 0, size_t(count * n) * elem,
                                   stream_of(c)));
        continue;
      }
      st->expert_gemm(count, we, x + size_t(start * k) * elem, y + size_t(start * n) * elem);
    }
    st->join_slots(c);
  };
}

// grouped_matmul_wgrad (out = c.out[0], inputs from 0) and its accumulating form (out = the
// destination c.in[0], inputs from 1; `into` set): the same expert GEMMs, the latter's C float32
// for bf16 operands and beta 1 unless it overwrites.
KernelFn make_wgrad_kernel(const Node& node, const Graph& graph, bool into) {
  const int first = into ? 1 : 0;
  const TensorMeta& am = graph.value(node.inputs.at(first)).meta;
  const TensorMeta& bm = graph.value(node.inputs.at(first + 1)).meta;
  const ValueId groups = node.inputs.at(first + 2);
  cuda_type(am.dtype);
  ExpertGemmShape shape = wgrad_shape(am, bm);
  const bool overwrite = !into || node.attrs.b("overwrite");
  if (into) {
    shape.f32_out = graph.value(node.inputs.at(0)).meta.dtype != am.dtype;
    shape.accumulate = !overwrite;
  }
  const char* what = into ? ops::kGroupedWgradAccumulateOp : "grouped_matmul_wgrad";
  const int64_t experts = graph.value(groups).meta.shape[1];
  // The Hopper kernel writes bf16 only outright (a bf16 += stays with cuBLAS).
  if ((shape.f32_out || !shape.accumulate) &&
      use_sm90(node, am.dtype, experts, bm.shape[1], am.shape[1], am.shape[0])) {
    const bool f32_out = shape.f32_out, accumulate = shape.accumulate;
    return [experts, first, into, f32_out, accumulate, what](KernelContext& c) {
      const Tensor& ta = c.in[first];
      const Tensor& tb = c.in[first + 1];
      const GroupedWgradSm90 g{ta.raw(),
                               tb.raw(),
                               into ? c.in[0].raw() : c.out[0].raw(),
                               static_cast<const int32_t*>(c.in[first + 2].raw()),
                               experts,
                               ta.shape()[0],
                               ta.shape()[1],
                               tb.shape()[1],
                               f32_out,
                               accumulate};
      const int variant = grouped_wgrad_sm90_variant_for(g.rows / experts);
      MT_CHECK(grouped_wgrad_sm90(g, stream_of(c), variant),
               "{} at '{}': the Hopper grouped GEMM refused it after prepare took it (a buffer "
               "not 16-byte aligned?)",
               what, c.node->scope);
    };
  }
  auto st = std::make_shared<GroupedState>(graph, groups, experts, am.dtype, shape);
  const size_t out_elem = shape.f32_out ? sizeof(float) : dtype_size(am.dtype);
  return [st, first, into, overwrite, what, out_elem](KernelContext& c) {
    const Tensor& ta = c.in[first];
    const Tensor& tb = c.in[first + 1];
    const int64_t rows = ta.shape()[0], p = ta.shape()[1], q = tb.shape()[1];
    const int64_t e = st->experts;
    const size_t elem = dtype_size(st->dtype);
    const int32_t* g = st->host_groups(c, c.in[first + 2], rows, what);
    st->fork_slots(c);
    const char* a = static_cast<const char*>(ta.raw());
    const char* b = static_cast<const char*>(tb.raw());
    char* out = static_cast<char*>(into ? c.in[0].raw() : c.out[0].raw());
    for (int64_t ex = 0; ex < e; ++ex) {
      const int64_t start = g[ex], count = g[e + ex];
      char* oe = out + size_t(ex * p * q) * out_elem;
      if (p == 0 || q == 0) continue;
      if (count == 0) {
        if (overwrite) CUDA_CHECK(cudaMemsetAsync(oe, 0, size_t(p * q) * out_elem, stream_of(c)));
        continue;
      }
      // Row-major out_e[p, q] = a_eᵀ b_e; column-major: out_eᵀ[q, p] = b_eᵀ · a_e, where b_e
      // stored row-major [count, q] is column-major b_eᵀ (ld q) and a_e is column-major a_eᵀ
      // (ld p), used transposed.
      st->expert_gemm(count, b + size_t(start * q) * elem, a + size_t(start * p) * elem, oe);
    }
    st->join_slots(c);
  };
}

// Scratch: cuBLAS's recommended workspace on Hopper, split into one slice per GEMM stream.
size_t gemm_workspace(const std::vector<TensorMeta>&, const std::vector<TensorMeta>&,
                      const Attrs&) {
  return kGemmWorkspaceBytes;
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory("grouped_matmul", DeviceType::kCUDA,
                                            make_grouped_matmul, gemm_workspace);
  OpRegistry::instance().add_kernel_factory(
      "grouped_matmul_wgrad", DeviceType::kCUDA,
      [](const Node& n, const Graph& g) { return make_wgrad_kernel(n, g, false); }, gemm_workspace);
  OpRegistry::instance().add_kernel_factory(
      ops::kGroupedWgradAccumulateOp, DeviceType::kCUDA,
      [](const Node& n, const Graph& g) { return make_wgrad_kernel(n, g, true); }, gemm_workspace);
}

}  // namespace
}  // namespace meshtrain::cuda
