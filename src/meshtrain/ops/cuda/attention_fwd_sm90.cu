// bf16 flash-attention forward on Hopper's asynchronous path (FlashAttention-3's schedule, written
// from the paper): one CTA of 3 warpgroups per (batch, q head, 128 query rows). Warpgroup 0 is the
// producer (TMA loads of Q once and of K/V tiles into a two-stage ring, completing on mbarriers);
// warpgroups 1 and 2 each own 64 query rows and run S = Q Kᵀ and O += P V as wgmma, overlapping the
// softmax of tile j with the Q Kᵀ of tile j+1 and (pingpong) with the other warpgroup's GEMMs.
// Key tiles run from the diagonal down, so only the first tile a CTA sees needs a mask.
#include <atomic>
#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/attention_mma.cuh"
#include "meshtrain/ops/cuda/hopper_mma.cuh"

namespace meshtrain::cuda {
namespace sm90 {

using namespace hopper;

struct FwdParams {
  CUtensorMap tm_q, tm_k, tm_v, tm_o;  // q/k/v boxes of 64 columns x kBM / kBN rows; o 64 x 64
  float* lse;
  int seq, heads_q, group, num_m_blocks;  // group = heads_q / heads_kv
  float scale, scale_log2;                // softmax scale, and scale * log2(e) for exp2
  int causal;
};

// Shared memory (from a 1024-aligned base): Q [kBM][DQK], two stages of K [kBN][DQK] and of
// V [kBN][DV], all swizzled column blocks (hopper_mma.cuh), then the mbarriers.
template <int DQK, int DV>
struct FwdConfig {
  static constexpr int kBM = 128, kBN = 128, kStages = 2, kThreads = 384;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128*24 + 256*240 = 64 K
  static constexpr uint32_t kQBytes = kBM * DQK * 2, kKBytes = kBN * DQK * 2;
  static constexpr uint32_t kVBytes = kBN * DV * 2;
  static constexpr uint32_t kKOff = kQBytes, kVOff = kKOff + kStages * kKBytes;
  static constexpr uint32_t kBarOff = kVOff + kStages * kVBytes;
  static constexpr size_t kSmem = kBarOff + 9 * 8 + 1024;  // + alignment slack
  static_assert(DQK % 64 == 0 && DV == 128, "the PV product is one m64n128 wgmma per k16 step");
  static_assert(kBN == 128, "the QKᵀ product is one m64n128 wgmma per k16 step");
  static_assert(kSmem <= 227 * 1024, "shared memory per CTA");
};

// Barrier addresses: q full; k/v full (producer -> consumers, TMA bytes) and empty (consumers ->
// producer: one arrival per consumer warp) per stage.
struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t k_full(int s) const { return base + 8 + 8 * s; }
  __device__ uint32_t v_full(int s) const { return base + 24 + 8 * s; }
  __device__ uint32_t k_empty(int s) const { return base + 40 + 8 * s; }
  __device__ uint32_t v_empty(int s) const { return base + 56 + 8 * s; }
};
constexpr uint32_t kConsumerWarps = 8;

// Keys past the end of the sequence, or after the query under causal masking, get -inf.
// `row` is this thread's upper row (global index); the lower one is row + 8.
__device__ __forceinline__ void mask_tile(float (&s)[64], int n0, int row, int lane, int seq,
                                          bool causal) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = n0 + 8 * j + 2 * (lane & 3) + (e & 1);
      const int r = row + 8 * (e >> 1);
      if (col >= seq || (causal && col > r)) s[4 * j + e] = -INFINITY;
    }
}

// Online softmax of one tile: new row maxima over the quad sharing a row, s <- exp2 of the scaled,
// shifted scores in place, l <- alpha*l + rowsum (per-thread partial sums; the quad's are summed in
// the epilogue). alpha = exp(old max - new max) rescales what came before.
template <bool kFirst>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = kFirst ? -INFINITY : m[r];
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with only masked keys so far keeps max -inf; shifting by 0 keeps exp2 away from NaN.
    const float msl = mx == -INFINITY ? 0.f : mx * scale_log2;
    alpha[r] = kFirst ? 1.f : attn::fast_exp2(m[r] * scale_log2 - msl);
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[4 * j + e] = attn::fast_exp2(fmaf(s[4 * j + e], scale_log2, -msl));
        sum += s[4 * j + e];
      }
    l[r] = kFirst ? sum : l[r] * alpha[r] + sum;
  }
}

template <int DQK, int DV, bool kPingpong>
__global__ void __launch_bounds__(384, 1) fwd_sm90_kernel(const __grid_constant__ FwdParams p) {
  using C = FwdConfig<DQK, DV>;
  constexpr int BM = C::kBM, BN = C::kBN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + C::kKOff, sV = base + C::kVOff;
  const Barriers bars{base + C::kBarOff};

  const int b = int(blockIdx.x) / p.heads_q, h = int(blockIdx.x) % p.heads_q, g = h / p.group;
  const int m0 = (p.num_m_blocks - 1 - int(blockIdx.y)) * BM;  // heaviest (causal) blocks first
  const int S = p.seq;
  const int kv_end = p.causal ? min(S, m0 + BM) : S;
  const int n_tiles = (kv_end + BN - 1) / BN;  // >= 1: m0 < S

  if (threadIdx.x == 0) {
    mbar_init(bars.q_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(bars.k_full(s), 1);
      mbar_init(bars.v_full(s), 1);
      mbar_init(bars.k_empty(s), kConsumerWarps);
      mbar_init(bars.v_empty(s), kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    // ---- producer: one thread issues every TMA copy --------------------------------------------
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&p.tm_q);
      tma_prefetch_map(&p.tm_k);
      tma_prefetch_map(&p.tm_v);
      mbar_arrive_expect_tx(bars.q_full(), C::kQBytes);
#pragma unroll
      for (int c = 0; c < DQK / 64; ++c)
        tma_load_4d(&p.tm_q, sQ + c * BM * 128, bars.q_full(), c * 64, h, m0, b);
      for (int it = 0; it < n_tiles; ++it) {
        const int st = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        const int n0 = (n_tiles - 1 - it) * BN;
        mbar_wait(bars.k_empty(st), ph ^ 1);
        mbar_arrive_expect_tx(bars.k_full(st), C::kKBytes);
#pragma unroll
        for (int c = 0; c < DQK / 64; ++c)
          tma_load_4d(&p.tm_k, sK + st * C::kKBytes + c * BN * 128, bars.k_full(st), c * 64, g, n0,
                      b);
        mbar_wait(bars.v_empty(st), ph ^ 1);
        mbar_arrive_expect_tx(bars.v_full(st), C::kVBytes);
#pragma unroll
        for (int c = 0; c < DV / 64; ++c)
          tma_load_4d(&p.tm_v, sV + st * C::kVBytes + c * BN * 128, bars.v_full(st), c * 64, g, n0,
                      b);
      }
    }
  } else {
    // ---- consumers: warpgroup w owns query rows m0 + 64w .. +63 ---------------------------------
    setmaxnreg_inc<C::kConsumerRegs>();
    const int w = wg - 1, t = int(threadIdx.x) - 128 * wg, lane = t & 31;
    const int row_in_wg = 16 * (t >> 5) + (lane >> 2);  // upper row; the lower one is +8
    const int row = m0 + 64 * w + row_in_wg;
    const uint32_t q_rows = sQ + w * 64 * 128;
    const bool causal = p.causal != 0;
    // Pingpong: warpgroup w issues its GEMMs after the other one issued (named barrier 1 + w),
    // so one warpgroup's softmax runs while the tensor cores work on the other's products.
    auto turn_wait = [&] {
      if (kPingpong) named_bar_sync(1 + w, 256);
    };
    auto turn_pass = [&](bool last) {
      if (kPingpong && !(last && w == 1)) named_bar_arrive(2 - w, 256);
    };
    if (kPingpong && w == 1) named_bar_arrive(1, 256);  // warpgroup 0 goes first
    auto needs_mask = [&](int n0) { return n0 + BN > S || (causal && n0 + BN - 1 > m0 + 64 * w); };
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };

    float s[64], o[64], m[2], l[2], alpha[2];
    uint32_t pr[BN / 4];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;

    // Tile 0 (the highest key tile): S, mask, softmax, P.
    mbar_wait(bars.q_full(), 0);
    mbar_wait(bars.k_full(0), 0);
    turn_wait();
    wgmma_fence();
    wgmma_m64n128_kmajor<DQK>(s, q_rows, BM * 128, sK, BN * 128);
    wgmma_commit();
    turn_pass(false);
    wgmma_wait<0>();
    fence_regs(s);
    release(bars.k_empty(0));
    if (needs_mask((n_tiles - 1) * BN)) mask_tile(s, (n_tiles - 1) * BN, row, lane, S, causal);
    softmax_tile<true>(s, m, l, alpha, p.scale_log2);
    acc_to_a_regs<BN>(pr, s);

    for (int it = 1; it < n_tiles; ++it) {
      const int st = it & 1, pst = st ^ 1;
      const uint32_t ph = (it >> 1) & 1, pph = ((it - 1) >> 1) & 1;
      mbar_wait(bars.k_full(st), ph);
      mbar_wait(bars.v_full(pst), pph);
      turn_wait();
      wgmma_fence();
      fence_regs(o);
      fence_regs(pr);
      wgmma_m64n128_kmajor<DQK>(s, q_rows, BM * 128, sK + st * C::kKBytes, BN * 128);
      wgmma_commit();
      wgmma_m64n128_regs_mnmajor<BN>(o, pr, sV + pst * C::kVBytes, BN * 128);
      wgmma_commit();
      turn_pass(false);
      wgmma_wait<1>();  // S of this tile is ready; P V of the previous one still runs
      fence_regs(s);
      release(bars.k_empty(st));
      const int n0 = (n_tiles - 1 - it) * BN;
      if (needs_mask(n0)) mask_tile(s, n0, row, lane, S, causal);
      softmax_tile<false>(s, m, l, alpha, p.scale_log2);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pr);
      release(bars.v_empty(pst));
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
      acc_to_a_regs<BN>(pr, s);
    }

    // The last P V.
    const int lst = (n_tiles - 1) & 1;
    mbar_wait(bars.v_full(lst), ((n_tiles - 1) >> 1) & 1);
    turn_wait();
    wgmma_fence();
    fence_regs(o);
    fence_regs(pr);
    wgmma_m64n128_regs_mnmajor<BN>(o, pr, sV + lst * C::kVBytes, BN * 128);
    wgmma_commit();
    turn_pass(true);
    wgmma_wait<0>();
    fence_regs(o);

    // Epilogue: lse, then O / l as bf16 into this warpgroup's rows of the Q tile (swizzled like
    // the TMA box) and one TMA store per 64-column block (rows past the sequence are not written).
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      inv[r] = 1.f / l[r];
      const int gr = row + 8 * r;
      if ((lane & 3) == 0 && gr < S)
        p.lse[(int64_t(b) * p.heads_q + h) * S + gr] = m[r] * p.scale + logf(l[r]);
    }
#pragma unroll
    for (int j = 0; j < DV / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int rr = row_in_wg + 8 * r;
        const uint32_t addr =
            q_rows + (j / 8) * BM * 128 + rr * 128 + ((((j % 8) ^ (rr & 7))) << 4) + (lane & 3) * 4;
        const uint32_t v = pack_bf16x2(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
      }
    fence_proxy_async_smem();
    named_bar_sync(3 + w, 128);
    if (t == 0) {
#pragma unroll
      for (int c = 0; c < DV / 64; ++c)
        tma_store_4d(&p.tm_o, q_rows + c * BM * 128, c * 64, h, m0 + 64 * w, b);
      tma_store_commit();
      tma_store_wait_read();
    }
  }
}

// ---- host
// ----------------------------------------------------------------------------------------

void encode_map(CUtensorMap* map, const void* ptr, int64_t d, int64_t heads, int64_t seq,
                int64_t batch, uint32_t box_rows) {
  const uint64_t dims[4] = {uint64_t(d), uint64_t(heads), uint64_t(seq), uint64_t(batch)};
  const uint64_t strides[3] = {uint64_t(d * 2), uint64_t(heads * d * 2),
                               uint64_t(seq * heads * d * 2)};
  const uint32_t box[4] = {64, 1, box_rows, 1};
  const CUresult rc = encode_tensor_map_bf16_4d(map, ptr, dims, strides, box);
  MT_CHECK(rc == CUDA_SUCCESS,
           "attention sm90: cuTensorMapEncodeTiled failed with CUresult {} for [B {}, S {}, H {}, "
           "D {}] at {} (box rows {}); the driver may be older than CUDA 12",
           int(rc), batch, seq, heads, d, ptr, box_rows);
}

template <int DQK, int DV, bool kPingpong>
void launch(const AttnShape& s, const void* q, const void* k, const void* v, void* out, float* lse,
            cudaStream_t stream) {
  using C = FwdConfig<DQK, DV>;
  constexpr auto kernel = fwd_sm90_kernel<DQK, DV, kPingpong>;
  attn::set_smem_limit_once<kernel>(C::kSmem);
  FwdParams p;
  encode_map(&p.tm_q, q, DQK, s.heads_q, s.seq, s.batch, C::kBM);
  encode_map(&p.tm_k, k, DQK, s.heads_kv, s.seq, s.batch, C::kBN);
  encode_map(&p.tm_v, v, DV, s.heads_kv, s.seq, s.batch, C::kBN);
  encode_map(&p.tm_o, out, DV, s.heads_q, s.seq, s.batch, 64);
  p.lse = lse;
  p.seq = int(s.seq);
  p.heads_q = int(s.heads_q);
  p.group = int(s.heads_q / s.heads_kv);
  p.num_m_blocks = int((s.seq + C::kBM - 1) / C::kBM);
  p.scale = float(s.scale);
  p.scale_log2 = float(s.scale * M_LOG2E);
  p.causal = s.causal ? 1 : 0;
  const dim3 grid(unsigned(s.batch * s.heads_q), unsigned(p.num_m_blocks));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH("attention_fwd_bf16_sm90");
}

using Launch = void (*)(const AttnShape&, const void*, const void*, const void*, void*, float*,
                        cudaStream_t);
struct Variant {
  int dim_qk, dim_v;
  const char* name;
  Launch launch;
};
// The first of each head-dim pair is the default; bench_attention times them all.
constexpr Variant kVariants[] = {
    {192, 128, "wgmma 128x128 pingpong", &launch<192, 128, true>},
    {192, 128, "wgmma 128x128", &launch<192, 128, false>},
    {128, 128, "wgmma 128x128 pingpong", &launch<128, 128, true>},
    {128, 128, "wgmma 128x128", &launch<128, 128, false>},
};

const Variant* find_variant(int64_t dqk, int64_t dv, int variant) {
  int seen = 0;
  for (const Variant& f : kVariants)
    if (f.dim_qk == dqk && f.dim_v == dv && seen++ == variant) return &f;
  return nullptr;
}

// Compute capability 9.0 of the current device, asked once per device.
// No usable device (a CUDA build asked on a machine without a GPU) answers no.
bool device_is_sm90() {
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; keep it from surfacing at the next launch check
    return false;
  }
  if (device < 64 && cached[device].load() != 0) return cached[device].load() == 1;
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool yes = major == 9 && minor == 0;
  if (device < 64) cached[device].store(yes ? 1 : 2);
  return yes;
}

}  // namespace sm90

bool attention_fwd_bf16_sm90_supports(const AttnShape& s) {
  return sm90::find_variant(s.dim_qk, s.dim_v, 0) != nullptr && s.heads_kv > 0 &&
         s.heads_q % s.heads_kv == 0 && s.seq < (int64_t(1) << 31) &&
         s.batch * s.heads_q < (int64_t(1) << 31) && sm90::device_is_sm90();
}

int attention_fwd_bf16_sm90_num_variants(int64_t dim_qk, int64_t dim_v) {
  int n = 0;
  for (const sm90::Variant& f : sm90::kVariants) n += f.dim_qk == dim_qk && f.dim_v == dim_v;
  return n;
}

const char* attention_fwd_bf16_sm90_variant_name(int64_t dim_qk, int64_t dim_v, int variant) {
  const sm90::Variant* f = sm90::find_variant(dim_qk, dim_v, variant);
  return f ? f->name : nullptr;
}

bool attention_fwd_bf16_sm90(const AttnShape& s, const void* q, const void* k, const void* v,
                             void* out, float* lse, cudaStream_t stream, int variant) {
  const sm90::Variant* f = sm90::find_variant(s.dim_qk, s.dim_v, variant);
  if (!f || !attention_fwd_bf16_sm90_supports(s)) return false;
  for (const void* ptr : {q, k, v, static_cast<const void*>(out)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;  // TMA needs 16-byte bases
  if (s.batch * s.seq * s.heads_q == 0) return true;               // nothing to compute
  f->launch(s, q, k, v, out, lse, stream);
  return true;
}

}  // namespace meshtrain::cuda
