// CUDA kernels of the token permutation, bit-identical to the CPU kernels.
// moe_dispatch_plan is a stable counting sort in three launches, with no atomics whose order
// could show: (1) one block per chunk of kDispatchChunk choices counts its choices per expert;
// (2) one block turns the counts into the padded group starts (groups row 0), the totals (row 1)
// and, per (chunk, expert), the first buffer row that chunk's choices of that expert take;
// (3) one block per chunk ranks each choice among the earlier choices of the same expert in the
// chunk (warp match masks, then a prefix over the warps) and writes its row. The groups are then
// copied to a pinned host buffer for the grouped GEMMs (plan_groups.h).
// moe_permute first inverts the row map (one int32 per buffer row, -1 for rows no choice maps
// to), then writes every buffer row exactly once: the token's row (times its weight) or zeros.
#include <algorithm>

#include "meshtrain/moe/cuda/dispatch_workspace.h"
#include "meshtrain/moe/cuda/plan_groups.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

constexpr int kPlanThreads = int(kDispatchChunk);  // one thread per choice of a chunk
constexpr int kPlanWarps = kPlanThreads / 32;

// (1) chunk_counts[chunk, e] = choices of expert e in the chunk.
__global__ void dispatch_count_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t e,
                                      int32_t* __restrict__ chunk_counts) {
  extern __shared__ int32_t counts[];
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) counts[x] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kDispatchChunk + threadIdx.x;
  if (i < n) {
    const int32_t id = ids[i];
    MT_DEVICE_CHECK(id >= 0 && id < e, "moe_dispatch_plan: an expert id is outside [0, E)");
    atomicAdd(&counts[id], 1);  // integer: the total does not depend on the order
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x)
    chunk_counts[int64_t(blockIdx.x) * e + x] = counts[x];
}

// (2) One block: totals and padded starts into groups, chunk bases in place of the counts.
__global__ void dispatch_offsets_kernel(int32_t* __restrict__ chunk_base, int64_t chunks, int64_t e,
                                        int64_t align, int64_t capacity,
                                        int32_t* __restrict__ groups) {
  // Each thread owns experts x = threadIdx.x + j·blockDim.x: total over the chunks, and the
  // chunk bases relative to the group start.
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    int64_t run = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int32_t cnt = chunk_base[ch * e + x];
      chunk_base[ch * e + x] = int32_t(run);
      run += cnt;
    }
    groups[e + x] = int32_t(run);
  }
  __syncthreads();
  // Padded starts: a serial scan over the experts by thread 0 (E is at most a few hundred).
  if (threadIdx.x == 0) {
    int64_t row = 0;
    for (int64_t x = 0; x < e; ++x) {
      groups[x] = int32_t(row);
      row += (int64_t(groups[e + x]) + align - 1) / align * align;
    }
    MT_DEVICE_CHECK(row <= capacity, "moe_dispatch_plan: the padded rows exceed the capacity");
  }
  __syncthreads();
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    const int32_t start = groups[x];
    for (int64_t ch = 0; ch < chunks; ++ch) chunk_base[ch * e + x] += start;
  }
}

// (3) row_map[i] = base[chunk, id] + (earlier choices of id in this chunk).
__global__ void dispatch_rank_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t e,
                                     const int32_t* __restrict__ chunk_base,
                                     int32_t* __restrict__ row_map) {
  extern __shared__ int32_t warp_counts[];  // [kPlanWarps, e], then exclusive prefix over warps
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t x = threadIdx.x; x < int64_t(kPlanWarps) * e; x += blockDim.x) warp_counts[x] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kDispatchChunk + threadIdx.x;
  const int32_t id = i < n ? ids[i] : -1;  // -1: no choice (matches only other padding lanes)
  const unsigned same = __match_any_sync(0xffffffffu, id);
  const int in_warp = __popc(same & ((1u << lane) - 1u));
  if (id >= 0 && in_warp == 0) warp_counts[int64_t(warp) * e + id] = __popc(same);
  __syncthreads();
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < kPlanWarps; ++w) {
      const int32_t c = warp_counts[int64_t(w) * e + x];
      warp_counts[int64_t(w) * e + x] = run;
      run += c;
    }
  }
  __syncthreads();
  if (id >= 0)
    row_map[i] =
        chunk_base[int64_t(blockIdx.x) * e + id] + warp_counts[int64_t(warp) * e + id] + in_warp;
}

void dispatch_plan(KernelContext& c, HostGroups& published) {
  const Attrs& a = c.attrs();
  const int64_t n = c.in[0].numel(), e = a.i("num_experts"), align = a.i("alignment");
  const int64_t chunks = dispatch_chunks(n);
  const int32_t* ids = in_ptr<int32_t>(c, 0);
  int32_t* row_map = out_ptr<int32_t>(c, 0);
  int32_t* groups = out_ptr<int32_t>(c, 1);
  int32_t* base = static_cast<int32_t*>(c.workspace.raw());
  cudaStream_t s = stream_of(c);
  const size_t count_smem = size_t(e) * sizeof(int32_t);
  const size_t rank_smem = size_t(kPlanWarps) * size_t(e) * sizeof(int32_t);
  if (rank_smem > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(dispatch_rank_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(rank_smem)));
  }
  dispatch_count_kernel<<<unsigned(chunks), kPlanThreads, count_smem, s>>>(ids, n, e, base);
  CUDA_CHECK_LAUNCH("moe_dispatch_plan_count");
  dispatch_offsets_kernel<<<1, 256, 0, s>>>(base, chunks, e, align, ops::moe_capacity(n, e, align),
                                            groups);
  CUDA_CHECK_LAUNCH("moe_dispatch_plan_offsets");
  if (n > 0) {
    dispatch_rank_kernel<<<unsigned(chunks), kPlanThreads, rank_smem, s>>>(ids, n, e, base,
                                                                           row_map);
    CUDA_CHECK_LAUNCH("moe_dispatch_plan_rank");
  }
  // Publish the groups for the grouped GEMMs (plan_groups.h): a pinned copy and its event.
  CUDA_CHECK(cudaMemcpyAsync(published.pinned, groups, size_t(2 * e) * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaEventRecord(published.ready, s));
}

KernelFn make_dispatch_plan(const Node& node, const Graph& graph) {
  std::shared_ptr<HostGroups> published =
      host_groups_of(graph, node.outputs.at(1), node.attrs.i("num_experts"));
  return [published](KernelContext& c) { dispatch_plan(c, *published); };
}

__global__ void fill_minus_one_kernel(int32_t* __restrict__ p, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x)
    p[i] = -1;
}

__global__ void invert_row_map_kernel(const int32_t* __restrict__ row_map, int64_t n,
                                      int64_t capacity, int32_t* __restrict__ inv) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    const int32_t r = row_map[i];
    MT_DEVICE_CHECK(r >= 0 && r < capacity, "moe_permute: a row_map entry is outside the buffer");
    inv[r] = int32_t(i);
  }
}

// One block per buffer row: the source token's row (scaled by its weight) or zeros.
template <int V, typename T, typename W>
__global__ void permute_rows_kernel(const T* __restrict__ x, const int32_t* __restrict__ inv,
                                    const W* __restrict__ w, T* __restrict__ out, int64_t k,
                                    int64_t d) {
  const int64_t row = blockIdx.x;
  const int32_t choice = inv[row];
  Pack<T, V>* dst = reinterpret_cast<Pack<T, V>*>(out + row * d);
  const int64_t nv = d / V;
  if (choice < 0) {
    Pack<T, V> z;
#pragma unroll
    for (int j = 0; j < V; ++j) z.v[j] = T(0);
    for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) dst[c] = z;
    return;
  }
  const Pack<T, V>* src = reinterpret_cast<const Pack<T, V>*>(x + (choice / k) * d);
  if (w == nullptr) {
    for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) dst[c] = src[c];
    return;
  }
  using A = acc_t<T>;
  const A s = A(to_acc(w[choice]));
  for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) {
    Pack<T, V> p = src[c];
#pragma unroll
    for (int j = 0; j < V; ++j) p.v[j] = from_acc<T>(A(to_acc(p.v[j])) * s);
    dst[c] = p;
  }
}

template <typename T, typename W>
void permute_rows(const T* x, const int32_t* inv, const W* w, T* out, int64_t capacity, int64_t k,
                  int64_t d, cudaStream_t s) {
  if (capacity == 0 || d == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  auto threads_for = [](int64_t items) {
    return int(std::clamp<int64_t>((items + 31) / 32 * 32, 32, 256));
  };
  if (d % V == 0 && aligned16(x) && aligned16(out))
    permute_rows_kernel<V><<<unsigned(capacity), threads_for(d / V), 0, s>>>(x, inv, w, out, k, d);
  else
    permute_rows_kernel<1><<<unsigned(capacity), threads_for(d), 0, s>>>(x, inv, w, out, k, d);
  CUDA_CHECK_LAUNCH("moe_permute");
}

void permute(KernelContext& c) {
  const int64_t d = c.in[0].shape()[1];
  const int64_t k = c.in[1].shape()[1], n = c.in[1].numel();
  const int64_t capacity = c.out[0].shape()[0];
  int32_t* inv = static_cast<int32_t*>(c.workspace.raw());
  cudaStream_t s = stream_of(c);
  fill_minus_one_kernel<<<grid_for(capacity, 256), 256, 0, s>>>(inv, capacity);
  CUDA_CHECK_LAUNCH("moe_permute_clear");
  if (n > 0) {
    invert_row_map_kernel<<<grid_for(n, 256), 256, 0, s>>>(in_ptr<int32_t>(c, 1), n, capacity, inv);
    CUDA_CHECK_LAUNCH("moe_permute_invert");
  }
  const bool weighted = c.in.size() == 3;
  MT_DISPATCH_CUDA_FLOAT(c.in[0].dtype(), "moe_permute", [&] {
    const scalar_t* x = in_ptr<scalar_t>(c, 0);
    scalar_t* out = out_ptr<scalar_t>(c, 0);
    if (!weighted)
      permute_rows<scalar_t, scalar_t>(x, inv, nullptr, out, capacity, k, d, s);
    else if (c.in[2].dtype() == c.in[0].dtype())
      permute_rows(x, inv, in_ptr<scalar_t>(c, 2), out, capacity, k, d, s);
    else
      permute_rows(x, inv, in_ptr<float>(c, 2), out, capacity, k, d, s);  // bf16 rows
  });
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory(
      "moe_dispatch_plan", DeviceType::kCUDA, make_dispatch_plan,
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs& a) {
        return dispatch_plan_workspace_bytes(in[0].numel(), a.i("num_experts"));
      });
  add_cuda_kernel("moe_permute", permute,
                  [](const std::vector<TensorMeta>&, const std::vector<TensorMeta>& out,
                     const Attrs&) { return moe_permute_workspace_bytes(out[0].shape[0]); });
}

}  // namespace
}  // namespace meshtrain::cuda
