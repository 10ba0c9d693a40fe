// check_attention_layout: host-only emulation of the bf16 attention kernels' shared-memory and
// fragment index math (TileCopy, swz, frag_addr, base_*), with ldmatrix and mma.m16n8k16 modelled
// from the PTX ISA's fragment layouts. It replays every product the kernels issue (S = Q Kᵀ,
// O = P V, dV = Pᵀ dO, dK = dSᵀ Q, dQ = dS K and the output staging) on small-integer data, where
// fp32 is exact, and compares bit for bit. Needs no GPU: run it wherever the CUDA tree builds.
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "meshtrain/ops/cuda/attention_mma.cuh"

using namespace meshtrain::cuda::attn;

namespace {

std::vector<float> smem(1 << 20);  // one float per bf16 element
int failures = 0;

struct Regs4 {
  float v[4][2];
};  // one lane's ldmatrix.x4 result (or an A fragment)
struct RegsB {
  float v[2][2];
};  // one lane's B fragment
struct RegsC {
  float v[4] = {};
};  // one lane's m16n8 fp32 accumulator
using WarpA = std::array<Regs4, 32>;
using WarpB = std::array<RegsB, 32>;
using WarpC = std::array<RegsC, 32>;

std::vector<float> random_matrix(int rows, int cols) {
  std::vector<float> m(size_t(rows * cols));
  for (float& x : m) x = float(std::rand() % 7 - 3);
  return m;
}

template <int ROWS, int D, int THREADS, bool kLoad>
void copy_tile(int tile, std::vector<float>& g) {  // kLoad: global -> smem (load_tile)
  using C = TileCopy<ROWS, D, THREADS>;
  for (int tid = 0; tid < THREADS; ++tid)
    for (int it = 0; it < ROWS / C::kRowStep; ++it)
      for (int seg = 0; seg < D / 64; ++seg) {
        const int s = tile + C::smem_offset(tid) + it * C::kRowStep * D + seg * 64;
        const int row = (tid >> 3) + it * C::kRowStep, col = (tid & 7) * 8 + seg * 64;
        for (int e = 0; e < 8; ++e) {
          float& gv = g[size_t(row * D + col + e)];
          if (kLoad)
            smem[size_t(s + e)] = gv;
          else
            gv = smem[size_t(s + e)];
        }
      }
}
template <int ROWS, int D, int THREADS>
void load(int tile, std::vector<float> g) {
  copy_tile<ROWS, D, THREADS, true>(tile, g);
}
template <int ROWS, int D, int THREADS>
std::vector<float> store(int tile) {
  std::vector<float> g(size_t(ROWS * D), NAN);
  copy_tile<ROWS, D, THREADS, false>(tile, g);
  return g;
}

// ldmatrix.x4: lanes 8i..8i+7 name the rows of matrix i; lane t gets (row t/4, cols 2(t%4)+e) of
// each matrix, or (rows 2(t%4)+e, col t/4) with .trans.
template <typename Addr>
WarpA ldmatrix(Addr addr, bool trans) {
  WarpA r{};
  for (int i = 0; i < 4; ++i) {
    float m[8][8];
    for (int row = 0; row < 8; ++row) {
      const uint32_t a = addr(8 * i + row);
      if (a % 16) std::printf("unaligned ldmatrix address %u\n", a), ++failures;
      for (int c = 0; c < 8; ++c) m[row][c] = smem[a / 2 + size_t(c)];
    }
    for (int t = 0; t < 32; ++t)
      for (int e = 0; e < 2; ++e)
        r[size_t(t)].v[i][e] = trans ? m[2 * (t % 4) + e][t / 4] : m[t / 4][2 * (t % 4) + e];
  }
  return r;
}
// Registers 0-1 are the B fragment of the first n8 tile, 2-3 of the second.
WarpB b_half(const WarpA& x, int half) {
  WarpB b{};
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 2; ++e)
      for (int r = 0; r < 2; ++r) b[size_t(t)].v[r][e] = x[size_t(t)].v[2 * half + r][e];
  return b;
}

void mma(WarpC& d, const WarpA& a, const WarpB& b) {
  float A[16][16], B[16][8];
  for (int t = 0; t < 32; ++t) {
    const int g = t / 4, q = t % 4;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * q + e] = a[size_t(t)].v[0][e];
      A[g + 8][2 * q + e] = a[size_t(t)].v[1][e];
      A[g][2 * q + 8 + e] = a[size_t(t)].v[2][e];
      A[g + 8][2 * q + 8 + e] = a[size_t(t)].v[3][e];
      B[2 * q + e][g] = b[size_t(t)].v[0][e];
      B[2 * q + 8 + e][g] = b[size_t(t)].v[1][e];
    }
  }
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 4; ++e) {
      const int row = t / 4 + (e >> 1) * 8, col = 2 * (t % 4) + (e & 1);
      for (int k = 0; k < 16; ++k) d[size_t(t)].v[e] += A[row][k] * B[k][col];
    }
}

WarpC acc_from(const std::vector<float>& m, int ld, int r0, int c0) {
  WarpC c{};
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 4; ++e)
      c[size_t(t)].v[e] = m[size_t((r0 + t / 4 + (e >> 1) * 8) * ld + c0 + 2 * (t % 4) + (e & 1))];
  return c;
}
void acc_to(const WarpC& c, std::vector<float>& m, int ld, int r0, int c0) {
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 4; ++e)
      m[size_t((r0 + t / 4 + (e >> 1) * 8) * ld + c0 + 2 * (t % 4) + (e & 1))] = c[size_t(t)].v[e];
}
WarpA acc_to_a_emu(const WarpC& c0, const WarpC& c1) {  // mirrors acc_to_a
  WarpA a{};
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 2; ++e) {
      a[size_t(t)].v[0][e] = c0[size_t(t)].v[e];
      a[size_t(t)].v[1][e] = c0[size_t(t)].v[2 + e];
      a[size_t(t)].v[2][e] = c1[size_t(t)].v[e];
      a[size_t(t)].v[3][e] = c1[size_t(t)].v[2 + e];
    }
  return a;
}
template <int D>
void store_acc_emu(int tile, const WarpC& c, int r0, int c0) {  // mirrors store_acc
  for (int t = 0; t < 32; ++t) {
    const int row = r0 + t / 4, col = c0 + 2 * (t % 4);
    for (int e = 0; e < 4; ++e)
      smem[size_t(tile + swz<D>(row + (e >> 1) * 8, col + (e & 1)))] = c[size_t(t)].v[e];
  }
}

std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b, int m, int n,
                          int k, bool ta, bool tb) {  // op(a) [m,k] x op(b) [k,n]
  std::vector<float> c(size_t(m * n), 0.f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int x = 0; x < k; ++x)
        c[size_t(i * n + j)] +=
            a[size_t(ta ? x * m + i : i * k + x)] * b[size_t(tb ? j * k + x : x * n + j)];
  return c;
}

void expect(const std::vector<float>& got, const std::vector<float>& ref, const char* what, int dqk,
            int dv, int bm, int bn, int warps) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += !(got[i] == ref[i]);
  std::printf("%-28s %3d/%-3d BM%-3d BN%-3d %d warps: %s (%d of %zu wrong)\n", what, dqk, dv, bm,
              bn, warps, bad ? "FAIL" : "ok", bad, ref.size());
  failures += bad > 0;
}

// The forward's products, warp by warp, exactly as attention_fwd.cu issues them.
template <int DQK, int DV, int BM, int BN, int WARPS>
void check_forward() {
  constexpr int kThreads = WARPS * 32, MT = BM / (16 * WARPS);
  const std::vector<float> Q = random_matrix(BM, DQK), K = random_matrix(BN, DQK);
  const std::vector<float> V = random_matrix(BN, DV);
  std::fill(smem.begin(), smem.end(), NAN);
  const int sQ = 64, sK = sQ + BM * DQK + 192, sV = sK + BN * DQK + 320;  // odd 128 B offsets
  load<BM, DQK, kThreads>(sQ, Q);
  load<BN, DQK, kThreads>(sK, K);
  load<BN, DV, kThreads>(sV, V);
  const std::vector<float> S_ref = matmul(Q, K, BM, BN, DQK, false, true);
  const std::vector<float> O_ref = matmul(S_ref, V, BM, DV, BN, false, false);
  std::vector<float> S(S_ref.size(), NAN), O(O_ref.size(), NAN);
  for (int warp = 0; warp < WARPS; ++warp) {
    const int row0 = warp * 16 * MT;
    std::vector<std::vector<WarpC>> s(MT, std::vector<WarpC>(BN / 8)),
        o(MT, std::vector<WarpC>(DV / 8));
    for (int ks = 0; ks < DQK / 16; ++ks) {
      std::vector<WarpA> a(MT);
      for (int mt = 0; mt < MT; ++mt)
        a[size_t(mt)] = ldmatrix(
            [&](int l) { return frag_addr<DQK>(2 * sQ, base_a<DQK>(l), ks, row0 + mt * 16); },
            false);
      for (int np = 0; np < BN / 16; ++np) {
        const WarpA bb = ldmatrix(
            [&](int l) { return frag_addr<DQK>(2 * sK, base_b<DQK>(l), ks, np * 16); }, false);
        for (int mt = 0; mt < MT; ++mt) {
          mma(s[size_t(mt)][size_t(2 * np)], a[size_t(mt)], b_half(bb, 0));
          mma(s[size_t(mt)][size_t(2 * np + 1)], a[size_t(mt)], b_half(bb, 1));
        }
      }
    }
    for (int kk = 0; kk < BN / 16; ++kk)
      for (int dp = 0; dp < DV / 16; ++dp) {
        const WarpA bb = ldmatrix(
            [&](int l) { return frag_addr<DV>(2 * sV, base_b_trans<DV>(l), dp, kk * 16); }, true);
        for (int mt = 0; mt < MT; ++mt) {
          const WarpA a =
              acc_to_a_emu(s[size_t(mt)][size_t(2 * kk)], s[size_t(mt)][size_t(2 * kk + 1)]);
          mma(o[size_t(mt)][size_t(2 * dp)], a, b_half(bb, 0));
          mma(o[size_t(mt)][size_t(2 * dp + 1)], a, b_half(bb, 1));
        }
      }
    for (int mt = 0; mt < MT; ++mt) {
      for (int nt = 0; nt < BN / 8; ++nt)
        acc_to(s[size_t(mt)][size_t(nt)], S, BN, row0 + mt * 16, nt * 8);
      for (int ot = 0; ot < DV / 8; ++ot) {
        acc_to(o[size_t(mt)][size_t(ot)], O, DV, row0 + mt * 16, ot * 8);
        store_acc_emu<DV>(sQ, o[size_t(mt)][size_t(ot)], row0 + mt * 16, ot * 8);
      }
    }
  }
  expect(S, S_ref, "forward S = Q Kᵀ", DQK, DV, BM, BN, WARPS);
  expect(O, O_ref, "forward O = P V", DQK, DV, BM, BN, WARPS);
  expect(store<BM, DV, kThreads>(sQ), O_ref, "forward O staging", DQK, DV, BM, BN, WARPS);
}

// The dK/dV pass's accumulating products (BM = BN = 64, 8 warps), P written as the score warps do.
template <int DQK, int DV>
void check_dkdv() {
  constexpr int BM = 64, BN = 64;
  const std::vector<float> P = random_matrix(BM, BN), dO = random_matrix(BM, DV);
  const std::vector<float> Q = random_matrix(BM, DQK);
  std::fill(smem.begin(), smem.end(), NAN);
  const int sP = 448, sdO = sP + BM * BN + 64, sQ = sdO + BM * DV + 576;
  for (int w = 0; w < 8; ++w)
    for (int j = 0; j < 4; ++j)
      store_acc_emu<BN>(sP, acc_from(P, BN, 16 * (w & 3), 32 * (w >> 2) + 8 * j), 16 * (w & 3),
                        32 * (w >> 2) + 8 * j);
  load<BM, DV, 256>(sdO, dO);
  load<BM, DQK, 256>(sQ, Q);
  const std::vector<float> dV_ref = matmul(P, dO, BN, DV, BM, true, false);
  const std::vector<float> dK_ref = matmul(P, Q, BN, DQK, BM, true, false);
  std::vector<float> dV(dV_ref.size(), NAN), dK(dK_ref.size(), NAN);
  for (int w = 0; w < 8; ++w) {
    const int wk = w & 1, wd = w >> 1;
    std::vector<std::vector<WarpC>> av(2, std::vector<WarpC>(DV / 32)),
        ak(2, std::vector<WarpC>(DQK / 32));
    for (int kq = 0; kq < BM / 16; ++kq) {
      WarpA a[2];
      for (int mt = 0; mt < 2; ++mt)
        a[mt] = ldmatrix(
            [&](int l) { return frag_addr<BN>(2 * sP, base_a_trans<BN>(l), 2 * wk + mt, 16 * kq); },
            true);
      for (int np = 0; np < DV / 64; ++np) {
        const WarpA bb = ldmatrix(
            [&](int l) {
              return frag_addr<DV>(2 * sdO, base_b_trans<DV>(l), wd * (DV / 64) + np, 16 * kq);
            },
            true);
        for (int mt = 0; mt < 2; ++mt) {
          mma(av[size_t(mt)][size_t(2 * np)], a[mt], b_half(bb, 0));
          mma(av[size_t(mt)][size_t(2 * np + 1)], a[mt], b_half(bb, 1));
        }
      }
      for (int np = 0; np < DQK / 64; ++np) {
        const WarpA bb = ldmatrix(
            [&](int l) {
              return frag_addr<DQK>(2 * sQ, base_b_trans<DQK>(l), wd * (DQK / 64) + np, 16 * kq);
            },
            true);
        for (int mt = 0; mt < 2; ++mt) {
          mma(ak[size_t(mt)][size_t(2 * np)], a[mt], b_half(bb, 0));
          mma(ak[size_t(mt)][size_t(2 * np + 1)], a[mt], b_half(bb, 1));
        }
      }
    }
    for (int mt = 0; mt < 2; ++mt) {
      for (int j = 0; j < DV / 32; ++j)
        acc_to(av[size_t(mt)][size_t(j)], dV, DV, 32 * wk + 16 * mt, wd * (DV / 4) + 8 * j);
      for (int j = 0; j < DQK / 32; ++j)
        acc_to(ak[size_t(mt)][size_t(j)], dK, DQK, 32 * wk + 16 * mt, wd * (DQK / 4) + 8 * j);
    }
  }
  expect(dV, dV_ref, "dK/dV pass dV = Pᵀ dO", DQK, DV, BM, BN, 8);
  expect(dK, dK_ref, "dK/dV pass dK = dSᵀ Q", DQK, DV, BM, BN, 8);
}

// The dQ pass's dQ = dS K for one warp (16 query rows, 64 keys).
template <int DQK>
void check_dq() {
  constexpr int BN = 64;
  const std::vector<float> dS = random_matrix(16, BN), K = random_matrix(BN, DQK);
  std::fill(smem.begin(), smem.end(), NAN);
  const int sK = 704;
  load<BN, DQK, 256>(sK, K);
  const std::vector<float> ref = matmul(dS, K, 16, DQK, BN, false, false);
  std::vector<float> dQ(ref.size(), NAN);
  std::vector<WarpC> acc(DQK / 8);
  for (int kk = 0; kk < BN / 16; ++kk) {
    const WarpA a = acc_to_a_emu(acc_from(dS, BN, 0, 16 * kk), acc_from(dS, BN, 0, 16 * kk + 8));
    for (int dp = 0; dp < DQK / 16; ++dp) {
      const WarpA bb = ldmatrix(
          [&](int l) { return frag_addr<DQK>(2 * sK, base_b_trans<DQK>(l), dp, 16 * kk); }, true);
      mma(acc[size_t(2 * dp)], a, b_half(bb, 0));
      mma(acc[size_t(2 * dp + 1)], a, b_half(bb, 1));
    }
  }
  for (int j = 0; j < DQK / 8; ++j) acc_to(acc[size_t(j)], dQ, DQK, 0, 8 * j);
  expect(dQ, ref, "dQ pass dQ = dS K", DQK, DQK, 128, BN, 8);
}

}  // namespace

int main() {
  check_forward<192, 128, 128, 32, 4>();
  check_forward<192, 128, 128, 64, 8>();
  check_forward<192, 128, 64, 64, 4>();
  check_forward<128, 128, 128, 32, 4>();
  check_forward<128, 128, 128, 64, 8>();
  check_forward<128, 128, 128, 64, 4>();
  check_forward<128, 128, 64, 64, 4>();
  check_forward<64, 64, 128, 64, 4>();
  check_dkdv<192, 128>();
  check_dkdv<128, 128>();
  check_dkdv<64, 64>();
  check_dq<192>();
  check_dq<128>();
  check_dq<64>();
  std::printf("%s\n",
              failures ? "check_attention_layout: FAILED" : "check_attention_layout: all ok");
  return failures ? 1 : 0;
}
