// GPU probes of the Hopper building blocks (see hopper_selfcheck.h): each kernel runs one
// warpgroup through exactly the helpers the attention forward and backward use, with operands
// placed by plain stores at the swizzled offsets hopper::sw128_offset names, and returns raw
// results to the host.
#include <stdexcept>
#include <string>

#include "hopper_selfcheck.h"
#include "meshtrain/ops/cuda/hopper_mma.cuh"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest::hopper {
namespace {

using namespace meshtrain::cuda::hopper;

__device__ __forceinline__ uint32_t aligned_base(unsigned char* raw, unsigned char** ptr) {
  const uint32_t r = smem_u32(raw), base = (r + 1023u) & ~1023u;
  *ptr = raw + (base - r);
  return base;
}

// Writes the warpgroup's m64n128 accumulator to row-major c[64][128].
__device__ __forceinline__ void store_acc(const float (&d)[64], float* c) {
  const int t = int(threadIdx.x), w = t / 32, l = t % 32;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[(16 * w + l / 4 + 8 * (e / 2)) * 128 + 8 * j + 2 * (l % 4) + e % 2] = d[4 * j + e];
}

__global__ void __launch_bounds__(128)
    kmajor_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  extern __shared__ unsigned char raw[];
  unsigned char* p = nullptr;
  const uint32_t base = aligned_base(raw, &p);
  constexpr int K = kSsK;
  constexpr uint32_t kB = 64 * K * 2;  // B's tile follows A's
  for (int i = int(threadIdx.x); i < 64 * K; i += 128)
    *reinterpret_cast<uint16_t*>(p + sw128_offset(64, i / K, i % K)) = a[i];
  for (int i = int(threadIdx.x); i < 128 * K; i += 128)
    *reinterpret_cast<uint16_t*>(p + kB + sw128_offset(128, i / K, i % K)) = b[i];
  fence_proxy_async_smem();  // plain stores, read next by the tensor cores
  __syncthreads();
  float d[64];
  wgmma_fence();
  wgmma_m64n128_kmajor<K>(d, base, 64 * 128, base + kB, 128 * 128);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
  store_acc(d, c);
}

__global__ void __launch_bounds__(128)
    regs_mnmajor_kernel(const float* pm, const uint16_t* v, float* c, int swap_strides) {
  extern __shared__ unsigned char raw[];
  unsigned char* p = nullptr;
  const uint32_t base = aligned_base(raw, &p);
  for (int i = int(threadIdx.x); i < 128 * 128; i += 128)
    *reinterpret_cast<uint16_t*>(p + sw128_offset(128, i / 128, i % 128)) = v[i];
  fence_proxy_async_smem();
  __syncthreads();
  // P in the accumulator layout, as the softmax leaves it, then bf16 A fragments.
  const int t = int(threadIdx.x), w = t / 32, l = t % 32;
  float s[64];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[4 * j + e] = pm[(16 * w + l / 4 + 8 * (e / 2)) * 128 + 8 * j + 2 * (l % 4) + e % 2];
  uint32_t a[32];
  acc_to_a_regs<128>(a, s);
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  wgmma_fence();
  if (!swap_strides) {
    wgmma_m64n128_regs_mnmajor<128>(d, a, base, 128 * 128);
  } else {
    const uint64_t db = wgmma_desc_sw128(base, kSw128Sbo, 128 * 128);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t ak[4] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
      wgmma_m64n128k16_rs_bt(d, ak, db + ((k * 16 * 128) >> 4), 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
  store_acc(d, c);
}

// C[64 x 64] = A[64 x K] B[64 x K]ᵀ through wgmma_m64n64k16_ss<kTransA, kTransB>: an operand is
// stored K-major ([64 rows][K], two 64-column blocks) or, transposed, MN-major ([K rows][64]).
template <int kTransA, int kTransB>
__global__ void __launch_bounds__(128) n64_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  extern __shared__ unsigned char raw[];
  unsigned char* p = nullptr;
  const uint32_t base = aligned_base(raw, &p);
  constexpr int K = kN64K;
  constexpr uint32_t kB = 64 * K * 2;
  auto offset = [](bool trans, int row, int k) {
    return trans ? sw128_offset(K, k, row) : sw128_offset(64, row, k);
  };
  for (int i = int(threadIdx.x); i < 64 * K; i += 128) {
    *reinterpret_cast<uint16_t*>(p + offset(kTransA, i / K, i % K)) = a[i];
    *reinterpret_cast<uint16_t*>(p + kB + offset(kTransB, i / K, i % K)) = b[i];
  }
  fence_proxy_async_smem();
  __syncthreads();
  // K-major: LBO unused, the k16 step moves 32 bytes inside a 64-column block (blocks 64 rows x
  // 128 bytes apart). MN-major: LBO = the (unused, one block) step between 64-element blocks,
  // the k16 step moves 16 rows.
  const uint64_t da = wgmma_desc_sw128(base, kTransA ? K * 128 : kKMajorLbo, kSw128Sbo);
  const uint64_t db = wgmma_desc_sw128(base + kB, kTransB ? K * 128 : kKMajorLbo, kSw128Sbo);
  auto step = [](bool trans, int ks) {
    return uint32_t(trans ? ks * 16 * 128 : (ks / 4) * 64 * 128 + (ks % 4) * 32) >> 4;
  };
  float d[32];
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks)
    wgmma_m64n64k16_ss<kTransA, kTransB>(d, da + step(kTransA, ks), db + step(kTransB, ks), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
  const int t = int(threadIdx.x), w = t / 32, l = t % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[(16 * w + l / 4 + 8 * (e / 2)) * 64 + 8 * j + 2 * (l % 4) + e % 2] = d[4 * j + e];
}

// C[64 x 192] = P[64 x 64] B[64 x 192]: P through the m64n64 accumulator layout and
// acc_to_a_regs<64>, B MN-major (three [64][64] column blocks), wgmma_m64n192k16_rs_bt.
__global__ void __launch_bounds__(128) n192_kernel(const float* pm, const uint16_t* b, float* c) {
  extern __shared__ unsigned char raw[];
  unsigned char* p = nullptr;
  const uint32_t base = aligned_base(raw, &p);
  for (int i = int(threadIdx.x); i < 64 * 192; i += 128)
    *reinterpret_cast<uint16_t*>(p + sw128_offset(64, i / 192, i % 192)) = b[i];
  fence_proxy_async_smem();
  __syncthreads();
  const int t = int(threadIdx.x), w = t / 32, l = t % 32;
  float s[32];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[4 * j + e] = pm[(16 * w + l / 4 + 8 * (e / 2)) * 64 + 8 * j + 2 * (l % 4) + e % 2];
  uint32_t a[16];
  acc_to_a_regs<64>(a, s);
  float d[96];
#pragma unroll
  for (int i = 0; i < 96; ++i) d[i] = 0.f;
  const uint64_t db = wgmma_desc_sw128(base, 64 * 128, kSw128Sbo);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t ak[4] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
    wgmma_m64n192k16_rs_bt(d, ak, db + ((k * 16 * 128) >> 4), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
#pragma unroll
  for (int j = 0; j < 24; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[(16 * w + l / 4 + 8 * (e / 2)) * 192 + 8 * j + 2 * (l % 4) + e % 2] = d[4 * j + e];
}

__global__ void tma_kernel(const __grid_constant__ CUtensorMap src,
                           const __grid_constant__ CUtensorMap dst, uint16_t* smem_out,
                           TmaProbe t) {
  extern __shared__ unsigned char raw[];
  unsigned char* p = nullptr;
  const uint32_t base = aligned_base(raw, &p);
  const uint32_t bar = base + uint32_t(t.rows) * 128;
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bar, uint32_t(t.rows) * 128);
    tma_load_4d(&src, base, bar, t.col0, t.head, t.row0, t.b);
  }
  mbar_wait(bar, 0);
  for (int i = int(threadIdx.x); i < t.rows * 64; i += int(blockDim.x))
    smem_out[i] = reinterpret_cast<const uint16_t*>(p)[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store_4d(&dst, base, t.col0, t.head, t.dst_row0, t.b);
    tma_store_commit();
    tma_store_wait_read();
  }
}

template <typename T>
struct Dev {
  explicit Dev(size_t n) : n(n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
  Dev(const std::vector<T>& h) : Dev(h.size()) {
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* p = nullptr;
  size_t n;
};

template <typename Kernel>
void allow_smem(Kernel k, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

void encode(CUtensorMap* map, const void* ptr, const TmaProbe& t) {
  const uint64_t dims[4] = {128, uint64_t(t.heads), uint64_t(t.seq), uint64_t(t.batch)};
  const uint64_t strides[3] = {256, uint64_t(t.heads) * 256, uint64_t(t.seq) * t.heads * 256};
  const uint32_t box[4] = {64, 1, uint32_t(t.rows), 1};
  const CUresult rc = encode_tensor_map_bf16_4d(map, ptr, dims, strides, box);
  if (rc != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed: CUresult " + std::to_string(int(rc)));
}

}  // namespace

std::vector<float> wgmma_kmajor(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != size_t(64 * kSsK) || b.size() != size_t(128 * kSsK))
    throw std::invalid_argument("wgmma_kmajor: A must be 64 x 192 and B 128 x 192");
  Dev<uint16_t> da(a), db(b);
  Dev<float> dc(64 * 128);
  const size_t smem = size_t(64 + 128) * kSsK * 2 + 1024;
  allow_smem(kmajor_kernel, smem);
  kmajor_kernel<<<1, 128, smem>>>(da.p, db.p, dc.p);
  CUDA_CHECK_LAUNCH("hopper selfcheck kmajor_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  return dc.get();
}

std::vector<float> wgmma_regs_mnmajor(const std::vector<float>& p, const std::vector<uint16_t>& v,
                                      bool swap_strides) {
  if (p.size() != size_t(64 * 128) || v.size() != size_t(128 * 128))
    throw std::invalid_argument("wgmma_regs_mnmajor: P must be 64 x 128 and V 128 x 128");
  Dev<float> dp(p), dc(64 * 128);
  Dev<uint16_t> dv(v);
  const size_t smem = size_t(128 * 128 * 2 + 1024);
  allow_smem(regs_mnmajor_kernel, smem);
  regs_mnmajor_kernel<<<1, 128, smem>>>(dp.p, dv.p, dc.p, swap_strides ? 1 : 0);
  CUDA_CHECK_LAUNCH("hopper selfcheck regs_mnmajor_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  return dc.get();
}

std::vector<float> wgmma_m64n64(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                                bool trans_a, bool trans_b) {
  if (a.size() != size_t(64 * kN64K) || b.size() != size_t(64 * kN64K))
    throw std::invalid_argument("wgmma_m64n64: A and B must be 64 x 128");
  Dev<uint16_t> da(a), db(b);
  Dev<float> dc(64 * 64);
  const size_t smem = size_t(2 * 64 * kN64K * 2 + 1024);
  auto run = [&](auto kernel) {
    allow_smem(kernel, smem);
    kernel<<<1, 128, smem>>>(da.p, db.p, dc.p);
  };
  if (trans_a)
    trans_b ? run(n64_kernel<1, 1>) : run(n64_kernel<1, 0>);
  else
    trans_b ? run(n64_kernel<0, 1>) : run(n64_kernel<0, 0>);
  CUDA_CHECK_LAUNCH("hopper selfcheck n64_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  return dc.get();
}

std::vector<float> wgmma_regs_n192(const std::vector<float>& p, const std::vector<uint16_t>& b) {
  if (p.size() != size_t(64 * 64) || b.size() != size_t(64 * 192))
    throw std::invalid_argument("wgmma_regs_n192: P must be 64 x 64 and B 64 x 192");
  Dev<float> dp(p), dc(64 * 192);
  Dev<uint16_t> dbuf(b);
  const size_t smem = size_t(64 * 192 * 2 + 1024);
  allow_smem(n192_kernel, smem);
  n192_kernel<<<1, 128, smem>>>(dp.p, dbuf.p, dc.p);
  CUDA_CHECK_LAUNCH("hopper selfcheck n192_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  return dc.get();
}

void tma_round_trip(const TmaProbe& t, const std::vector<uint16_t>& src,
                    const std::vector<uint16_t>& dst_init, std::vector<uint16_t>& smem,
                    std::vector<uint16_t>& dst) {
  const size_t n = size_t(t.batch) * t.seq * t.heads * 128;
  if (src.size() != n || dst_init.size() != n)
    throw std::invalid_argument("tma_round_trip: src and dst_init must hold the whole tensor");
  Dev<uint16_t> ds(src), dd(dst_init), dsm(size_t(t.rows) * 64);
  CUtensorMap ms, md;
  encode(&ms, ds.p, t);
  encode(&md, dd.p, t);
  const size_t bytes = size_t(t.rows) * 128 + 8 + 1024;
  allow_smem(tma_kernel, bytes);
  tma_kernel<<<1, 128, bytes>>>(ms, md, dsm.p, t);
  CUDA_CHECK_LAUNCH("hopper selfcheck tma_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  smem = dsm.get();
  dst = dd.get();
}

}  // namespace meshtrain::cudatest::hopper
