// bf16 flash-attention forward (FA2 schedule on mma.sync): one CTA per (batch, q head, block of BM
// query rows) walks the key/value tiles it can see with a two-stage cp.async pipeline, keeps the
// output accumulator and the online-softmax state in registers and never forms the S x S matrix.
// Writes out (bf16) and lse (fp32, natural log). Causal CTAs run heaviest-first.
#include <cmath>

#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/attention_mma.cuh"

namespace meshtrain::cuda {
namespace attn {

struct FwdParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* o;
  float* lse;
  int seq, heads_q, heads_kv, group;  // group = heads_q / heads_kv
  int num_m_blocks;
  float scale, scale_log2;  // softmax scale, and scale * log2(e) for exp2
  bool causal;
};

template <int DQK, int DV, int BM, int BN, int WARPS>
struct FwdConfig {
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kMTiles = BM / (16 * WARPS);  // m16 tiles of query rows per warp
  static constexpr size_t kSmem = size_t(BM * DQK + 2 * BN * DQK + 2 * BN * DV) * sizeof(bf16);
  static_assert(BM % (16 * WARPS) == 0 && BN % 16 == 0, "tile shape");
  static_assert(DQK % 64 == 0 && DV % 64 == 0 && DV <= DQK, "the output tile reuses Q's smem");
};

template <int DQK, int DV, int BM, int BN, int WARPS, int MIN_BLOCKS>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) fwd_kernel(const FwdParams p) {
  using Cfg = FwdConfig<DQK, DV, BM, BN, WARPS>;
  constexpr int kThreads = Cfg::kThreads, MT = Cfg::kMTiles, NT = BN / 8, OT = DV / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + BM * DQK;      // two stages of [BN][DQK]
  bf16* sV = sK + 2 * BN * DQK;  // two stages of [BN][DV]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x / p.heads_q, h = blockIdx.x % p.heads_q, g = h / p.group;
  const int m0 = (p.num_m_blocks - 1 - int(blockIdx.y)) * BM;
  const int S = p.seq;
  const int64_t ldq = int64_t(p.heads_q) * DQK, ldk = int64_t(p.heads_kv) * DQK;
  const int64_t ldv = int64_t(p.heads_kv) * DV, ldo = int64_t(p.heads_q) * DV;
  const bf16* q = p.q + (int64_t(b) * S + m0) * ldq + int64_t(h) * DQK;
  const bf16* k = p.k + int64_t(b) * S * ldk + int64_t(g) * DQK;
  const bf16* v = p.v + int64_t(b) * S * ldv + int64_t(g) * DV;

  const int kv_end = p.causal ? min(S, m0 + BM) : S;
  const int n_tiles = (kv_end + BN - 1) / BN;

  auto load_kv = [&](int jt, int stage) {
    load_kv_tiles<BN, DQK, DV, kThreads>(sK + stage * BN * DQK, sV + stage * BN * DV, k, v, ldk,
                                         ldv, jt * BN, S, tid);
  };
  load_tile<BM, DQK, kThreads>(sQ, q, ldq, S - m0, tid);
  cp_async_commit();
  load_kv(0, 0);
  cp_async_commit();

  float acc[MT][OT][4];
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int ot = 0; ot < OT; ++ot)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][ot][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  }
  const int warp_row0 = warp * 16 * MT;
  const uint32_t q_base = base_a<DQK>(lane), k_base = base_b<DQK>(lane);
  const uint32_t v_base = base_b_trans<DV>(lane);
  const uint32_t sq = smem_addr(sQ);

  for (int jt = 0; jt < n_tiles; ++jt) {
    const int st = pipeline_next_stage(jt, n_tiles, load_kv), n0 = jt * BN;
    const uint32_t tk = smem_addr(sK + st * BN * DQK), tv = smem_addr(sV + st * BN * DV);

    // S = Q K^T for this warp's rows and all BN keys.
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], frag_addr<DQK>(sq, q_base, ks, warp_row0 + mt * 16));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, frag_addr<DQK>(tk, k_base, ks, np * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(s[mt][2 * np], a[mt], bb[0], bb[1]);
          mma16816(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
      }
    }

    // Keys past the end, and keys after the query under causal masking, get -inf. Only the tiles
    // that straddle the diagonal or the sequence end pay for the test.
    if (n0 + BN > S || (p.causal && n0 + BN - 1 > m0)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + warp_row0 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
            const int col = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
            if (col >= S || (p.causal && col > row)) s[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax: new row max over the quad that shares a row, rescale what came before.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row that has seen only masked keys keeps max -inf; exp2 of -inf - -inf would be NaN.
        const float alpha = mx == -INFINITY ? 1.f : fast_exp2((row_max[mt][r] - mx) * p.scale_log2);
        const float msl = mx == -INFINITY ? 0.f : mx * p.scale_log2;
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const float pe = fast_exp2(fmaf(s[mt][nt][e], p.scale_log2, -msl));
            s[mt][nt][e] = pe;
            sum += pe;
          }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int ot = 0; ot < OT; ++ot) {
          acc[mt][ot][2 * r] *= alpha;
          acc[mt][ot][2 * r + 1] *= alpha;
        }
      }

      // O += P V with P (bf16) straight from the score registers.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < DV / 16; ++dp) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, frag_addr<DV>(tv, v_base, dp, kk * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(acc[mt][2 * dp], a[mt], bb[0], bb[1]);
          mma16816(acc[mt][2 * dp + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Epilogue: finish the row sums, write lse, stage O through Q's smem for 16-byte stores.
  float inv[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[mt][r] = 1.f / l;
      const int row = m0 + warp_row0 + mt * 16 + (lane >> 2) + r * 8;
      if ((lane & 3) == 0 && row < S)
        p.lse[(int64_t(b) * p.heads_q + h) * S + row] = row_max[mt][r] * p.scale + logf(l);
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ot = 0; ot < OT; ++ot)
      store_acc<DV>(sQ, acc[mt][ot], warp_row0 + mt * 16, ot * 8, lane, inv[mt][0], inv[mt][1]);
  __syncthreads();
  store_tile<BM, DV, kThreads>(p.o + (int64_t(b) * S + m0) * ldo + int64_t(h) * DV, ldo, sQ, S - m0,
                               tid);
}

template <int DQK, int DV, int BM, int BN, int WARPS, int MIN_BLOCKS>
void launch_fwd(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
                float* lse, cudaStream_t stream) {
  using Cfg = FwdConfig<DQK, DV, BM, BN, WARPS>;
  constexpr auto kernel = fwd_kernel<DQK, DV, BM, BN, WARPS, MIN_BLOCKS>;
  set_smem_limit_once<kernel>(Cfg::kSmem);
  FwdParams p;
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.o = static_cast<bf16*>(out);
  p.lse = lse;
  p.seq = int(s.seq);
  p.heads_q = int(s.heads_q);
  p.heads_kv = int(s.heads_kv);
  p.group = int(s.heads_q / s.heads_kv);
  p.num_m_blocks = int((s.seq + BM - 1) / BM);
  p.scale = float(s.scale);
  p.scale_log2 = float(s.scale * M_LOG2E);
  p.causal = s.causal;
  const dim3 grid(unsigned(s.batch * s.heads_q), unsigned(p.num_m_blocks));
  if (grid.x == 0 || grid.y == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH("attention_fwd_bf16");
}

namespace {

using FwdLaunch = void (*)(const AttnShape&, const void*, const void*, const void*, void*, float*,
                           cudaStream_t);
struct FwdVariant {
  int dim_qk, dim_v;
  const char* name;
  FwdLaunch launch;
};
// Tile variants (query rows per CTA x keys per tile, warps, "x2": two CTAs per SM); the first of
// each head-dim pair is the default. Two m16 tiles per warp (4 warps) halve the shared-memory
// traffic per mma and, with 32-key tiles, stay under 255 registers without spilling (ptxas -v);
// one tile per warp (8 warps) needs fewer registers but reads each K/V fragment for 16 rows only.
// Which wins on an H200 is for bench_attention to say: it times every variant.
constexpr FwdVariant kFwdVariants[] = {
    {192, 128, "BM128 BN32 4 warps x2", &launch_fwd<192, 128, 128, 32, 4, 2>},
    {192, 128, "BM128 BN64 8 warps", &launch_fwd<192, 128, 128, 64, 8, 1>},
    {192, 128, "BM64 BN64 4 warps x2", &launch_fwd<192, 128, 64, 64, 4, 2>},
    {128, 128, "BM128 BN32 4 warps x2", &launch_fwd<128, 128, 128, 32, 4, 2>},
    {128, 128, "BM128 BN64 8 warps", &launch_fwd<128, 128, 128, 64, 8, 1>},
    {128, 128, "BM128 BN64 4 warps x2 (spills)", &launch_fwd<128, 128, 128, 64, 4, 2>},
    {128, 128, "BM64 BN64 4 warps x2", &launch_fwd<128, 128, 64, 64, 4, 2>},
    {64, 64, "BM128 BN64 4 warps x2", &launch_fwd<64, 64, 128, 64, 4, 2>},
};

const FwdVariant* find_variant(int64_t dqk, int64_t dv, int variant) {
  int seen = 0;
  for (const FwdVariant& f : kFwdVariants)
    if (f.dim_qk == dqk && f.dim_v == dv && seen++ == variant) return &f;
  return nullptr;
}

}  // namespace
}  // namespace attn

int attention_fwd_bf16_num_variants(int64_t dim_qk, int64_t dim_v) {
  int n = 0;
  for (const attn::FwdVariant& f : attn::kFwdVariants) n += f.dim_qk == dim_qk && f.dim_v == dim_v;
  return n;
}

const char* attention_fwd_bf16_variant_name(int64_t dim_qk, int64_t dim_v, int variant) {
  const attn::FwdVariant* f = attn::find_variant(dim_qk, dim_v, variant);
  return f ? f->name : nullptr;
}

bool attention_fwd_bf16(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
                        float* lse, cudaStream_t stream, int variant) {
  const attn::FwdVariant* f = attn::find_variant(s.dim_qk, s.dim_v, variant);
  if (!f) return false;
  f->launch(s, q, k, v, out, lse, stream);
  return true;
}

}  // namespace meshtrain::cuda
