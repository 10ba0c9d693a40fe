// Hopper attention forward and backward (ops/cuda/attention_fwd_sm90.cu, attention_bwd_sm90.cu).
// First the probes of hopper_mma.cuh, one case each so the first failure names the layer: K-major
// wgmma from shared memory, register-A wgmma with an MN-major B, TMA load/store. Then every variant
// of the kernel against a float64 CPU reference on fresh random bf16 inputs (odd S, S below one
// tile, B·H odd, GQA, both head-dim pairs, causal and not), outputs NaN-poisoned with a poisoned
// guard past each buffer that must stay untouched; the default variant repeats bitwise. The same
// for the backward's variants. Probe data are small integers, so the fp32 products are exact and
// compared exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "hopper_selfcheck.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/runtime/cuda/cuda_check.h"
#include "op_harness.h"

namespace meshtrain {
namespace {

namespace hp = cudatest::hopper;
using cuda::AttnShape;

uint16_t bits(double x) { return BFloat16::from_float(float(x)); }
double value(uint16_t b) { return double(BFloat16::to_float(b)); }

std::vector<uint16_t> small_ints(size_t n, std::mt19937_64& rng, int lo, int hi) {
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bits(u(rng));
  return v;
}

// Exact comparison of a 64 x 128 product; names the first mismatches with their (row, col).
int count_mismatches(const std::vector<float>& got, const std::vector<double>& want,
                     std::string* first) {
  int bad = 0;
  for (int i = 0; i < 64 * 128; ++i)
    if (double(got[size_t(i)]) != want[size_t(i)] && ++bad <= 6)
      *first += fmt::format(" (row {}, col {}): got {} want {};", i / 128, i % 128, got[size_t(i)],
                            want[size_t(i)]);
  return bad;
}
constexpr const char* kLayoutHint =
    "whole 8-row groups wrong: SBO; columns 16k.. wrong: the k16 start-address step; values "
    "permuted inside 8-column chunks: the 128B swizzle; rows 8..15 of each warp swapped: the "
    "accumulator layout";

TEST(CudaHopperSelfCheck, WgmmaKMajorSharedOperandsMatchCpu) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  std::mt19937_64 rng(cudatest::fresh_seed());
  const int K = hp::kSsK;
  const auto a = small_ints(size_t(64 * K), rng, -3, 3),
             b = small_ints(size_t(128 * K), rng, -3, 3);
  std::vector<double> want(64 * 128, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j)
      for (int k = 0; k < K; ++k)
        want[size_t(i * 128 + j)] += value(a[size_t(i * K + k)]) * value(b[size_t(j * K + k)]);
  std::string first;
  const int bad = count_mismatches(hp::wgmma_kmajor(a, b), want, &first);
  EXPECT_EQ(bad, 0) << "C = A Bᵀ, K = 192, both K-major in swizzled smem:" << first << " ("
                    << kLayoutHint << ")";
}

TEST(CudaHopperSelfCheck, WgmmaRegisterAMnMajorBMatchesCpu) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  std::mt19937_64 rng(cudatest::fresh_seed());
  std::vector<float> p(64 * 128);
  for (float& x : p) x = float(int(rng() % 5) - 2);
  const auto v = small_ints(128 * 128, rng, -3, 3);
  std::vector<double> want(64 * 128, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j)
      for (int k = 0; k < 128; ++k)
        want[size_t(i * 128 + j)] += double(p[size_t(i * 128 + k)]) * value(v[size_t(k * 128 + j)]);
  std::string first;
  const int bad = count_mismatches(hp::wgmma_regs_mnmajor(p, v, false), want, &first);
  if (bad != 0) {
    std::string ignored;
    const int swapped = count_mismatches(hp::wgmma_regs_mnmajor(p, v, true), want, &ignored);
    ADD_FAILURE() << "O = P V, P from the accumulator layout through acc_to_a_regs, V MN-major: "
                  << bad << " mismatches:" << first
                  << (swapped == 0 ? " -- with LBO and SBO swapped it MATCHES: swap them in "
                                     "wgmma_m64n128_regs_mnmajor"
                                   : " -- swapping LBO and SBO does not help either")
                  << " (" << kLayoutHint << ")";
  }
}

// Exact comparison of a rows x cols product (row-major), naming the first mismatches.
int count_mismatches_n(const std::vector<float>& got, const std::vector<double>& want, int cols,
                       std::string* first) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (double(got[i]) != want[i] && ++bad <= 6)
      *first += fmt::format(" (row {}, col {}): got {} want {};", i / size_t(cols),
                            i % size_t(cols), got[i], want[i]);
  return bad;
}

TEST(CudaHopperSelfCheck, WgmmaM64N64EveryOperandLayoutMatchesCpu) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  std::mt19937_64 rng(cudatest::fresh_seed());
  const int K = hp::kN64K;
  const auto a = small_ints(size_t(64 * K), rng, -3, 3), b = small_ints(size_t(64 * K), rng, -3, 3);
  std::vector<double> want(64 * 64, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j)
      for (int k = 0; k < K; ++k)
        want[size_t(i * 64 + j)] += value(a[size_t(i * K + k)]) * value(b[size_t(j * K + k)]);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      std::string first;
      const int bad = count_mismatches_n(hp::wgmma_m64n64(a, b, ta, tb), want, 64, &first);
      EXPECT_EQ(bad, 0) << "C = A Bᵀ by m64n64k16, A " << (ta ? "MN" : "K") << "-major, B "
                        << (tb ? "MN" : "K") << "-major:" << first << " (" << kLayoutHint << ")";
    }
}

TEST(CudaHopperSelfCheck, WgmmaRegisterAN192MatchesCpu) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  std::mt19937_64 rng(cudatest::fresh_seed());
  std::vector<float> p(64 * 64);
  for (float& x : p) x = float(int(rng() % 5) - 2);
  const auto b = small_ints(64 * 192, rng, -3, 3);
  std::vector<double> want(64 * 192, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 192; ++j)
      for (int k = 0; k < 64; ++k)
        want[size_t(i * 192 + j)] += double(p[size_t(i * 64 + k)]) * value(b[size_t(k * 192 + j)]);
  std::string first;
  const int bad = count_mismatches_n(hp::wgmma_regs_n192(p, b), want, 192, &first);
  EXPECT_EQ(bad, 0) << "C = P B by m64n192k16, P from registers, B MN-major in three blocks:"
                    << first << " (" << kLayoutHint << ")";
}

// One box of `t` through TMA: the shared-memory image must be the source rows at the swizzled
// offsets (rows past the sequence zero), and the store must write exactly the in-range rows.
void check_tma(const hp::TmaProbe& t, uint64_t seed) {
  SCOPED_TRACE(
      fmt::format("TMA box {} rows at (col {}, head {}, row {}, batch {}) of [{} {} {} 128]",
                  t.rows, t.col0, t.head, t.row0, t.b, t.batch, t.seq, t.heads));
  std::mt19937_64 rng(seed);
  const size_t n = size_t(t.batch) * t.seq * t.heads * 128;
  const auto src = small_ints(n, rng, 1, 100);  // never zero: zero-fill shows
  const std::vector<uint16_t> init(n, 0xFFFF);
  std::vector<uint16_t> smem, dst;
  hp::tma_round_trip(t, src, init, smem, dst);
  auto at = [&](int b, int s, int h, int d) {
    return ((size_t(b) * t.seq + s) * t.heads + h) * 128 + d;
  };
  int bad_smem = 0;
  for (int r = 0; r < t.rows; ++r)
    for (int c = 0; c < 64; ++c) {
      const int s = t.row0 + r;
      const uint16_t want = s < t.seq ? src[at(t.b, s, t.head, t.col0 + c)] : 0;
      const size_t off = size_t(r) * 64 + size_t(((c / 8) ^ (r % 8)) * 8 + c % 8);
      if (smem[off] != want && ++bad_smem <= 4)
        ADD_FAILURE() << "smem row " << r << " col " << c << ": got " << smem[off] << " want "
                      << want
                      << (smem[size_t(r) * 64 + size_t(c)] == want
                              ? " (found unswizzled: TMA swizzle off?)"
                              : "");
    }
  EXPECT_EQ(bad_smem, 0) << "TMA load image differs from the 128B-swizzled layout";
  int bad_dst = 0;
  for (int b = 0; b < t.batch; ++b)
    for (int s = 0; s < t.seq; ++s)
      for (int h = 0; h < t.heads; ++h)
        for (int d = 0; d < 128; ++d) {
          const bool in_box = b == t.b && h == t.head && d >= t.col0 && d < t.col0 + 64 &&
                              s >= t.dst_row0 && s < t.dst_row0 + t.rows;
          const int from = s - t.dst_row0 + t.row0;
          const uint16_t want =
              in_box ? (from < t.seq ? src[at(t.b, from, t.head, d)] : uint16_t(0)) : 0xFFFF;
          bad_dst += dst[at(b, s, h, d)] != want;
        }
  EXPECT_EQ(bad_dst, 0) << "TMA store wrote outside its box, or not the box's in-range rows";
}

TEST(CudaHopperSelfCheck, TmaLoadStoreRoundTrip) {
  cudatest::cuda_backend();  // a clear failure where there is no GPU
  const uint64_t seed = cudatest::fresh_seed();
  // A 128-row box running past the sequence end (the K/V/Q tiles), and a 64-row box stored where
  // only part of it is inside (the output tile of one consumer warpgroup).
  check_tma({2, 100, 3, 128, 64, 2, 40, 1, 40}, seed);
  check_tma({2, 100, 3, 64, 0, 0, 0, 0, 64}, seed + 1);
}

// ---- the forward kernel
// --------------------------------------------------------------------------

struct Ref {
  std::vector<double> out, lse;
};

// softmax(scale · q kᵀ) v per (batch, q head), kv head h / (Hq / Hkv); causal: key <= query.
Ref reference(const AttnShape& s, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
              const std::vector<uint16_t>& v) {
  const int64_t S = s.seq, Hq = s.heads_q, Hk = s.heads_kv, Dq = s.dim_qk, Dv = s.dim_v;
  Ref r{std::vector<double>(size_t(s.batch * S * Hq * Dv)),
        std::vector<double>(size_t(s.batch * Hq * S))};
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hk);
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = s.causal ? i + 1 : S;
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < Dq; ++d)
            acc += value(q[size_t(((b * S + i) * Hq + h) * Dq + d)]) *
                   value(k[size_t(((b * S + j) * Hk + g) * Dq + d)]);
          p[size_t(j)] = acc * s.scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        r.lse[size_t((b * Hq + h) * S + i)] = mx + std::log(sum);
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j)
            o += p[size_t(j)] * value(v[size_t(((b * S + j) * Hk + g) * Dv + d)]);
          r.out[size_t(((b * S + i) * Hq + h) * Dv + d)] = o / sum;
        }
      }
    }
  return r;
}

constexpr size_t kGuard = 4096;  // poisoned bytes past each output that must stay poisoned

struct Buf {
  explicit Buf(size_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&p, n + kGuard)); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<uint8_t> get() const {
    std::vector<uint8_t> h(bytes + kGuard);
    CUDA_CHECK(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
  void* p = nullptr;
  size_t bytes;
};

void upload(const Buf& d, const std::vector<uint16_t>& h) {
  CUDA_CHECK(cudaMemcpy(d.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// ‖got − ref‖ / ‖ref‖ within `rel` and no NaN (unwritten) element.
void expect_rel(const std::vector<double>& got, const std::vector<double>& ref, double rel,
                const std::string& what) {
  double d2 = 0, r2 = 0;
  size_t nans = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) {
      ++nans;
      continue;
    }
    d2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    r2 += ref[i] * ref[i];
  }
  EXPECT_EQ(nans, 0u) << what << ": NaN (unwritten) elements";
  EXPECT_LE(std::sqrt(d2) / std::max(std::sqrt(r2), 1e-300), rel) << what << ": ‖got−ref‖/‖ref‖";
}

std::string case_name(const AttnShape& s) {
  return fmt::format("B{} S{} Hq{} Hkv{} ({}, {}) {}", s.batch, s.seq, s.heads_q, s.heads_kv,
                     s.dim_qk, s.dim_v, s.causal ? "causal" : "non-causal");
}

void check_shape(const AttnShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random = [&](int64_t n, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = bits(u(rng));
    return v;
  };
  const int64_t nq = s.batch * s.seq * s.heads_q * s.dim_qk, nk = s.batch * s.seq * s.heads_kv;
  const int64_t no = s.batch * s.seq * s.heads_q * s.dim_v, nl = s.batch * s.heads_q * s.seq;
  // q, k in [-2, 2) for a peaked softmax, v in [-1, 1) (as the other attention tests).
  const auto hq = random(nq, -2, 2), hk = random(nk * s.dim_qk, -2, 2);
  const auto hv = random(nk * s.dim_v, -1, 1);
  const Ref ref = reference(s, hq, hk, hv);
  Buf q(size_t(nq) * 2), k(size_t(nk * s.dim_qk) * 2), v(size_t(nk * s.dim_v) * 2);
  Buf out(size_t(no) * 2), lse(size_t(nl) * 4);
  upload(q, hq);
  upload(k, hk);
  upload(v, hv);
  Stream& stream = cudatest::cuda_backend().stream(0);
  auto st = static_cast<cudaStream_t>(stream.native_handle());
  const int variants = cuda::attention_fwd_bf16_sm90_num_variants(s.dim_qk, s.dim_v);
  ASSERT_GT(variants, 0) << case_name(s);
  std::vector<uint8_t> first_out, first_lse;
  for (int var = 0; var <= variants; ++var) {  // the last pass repeats the default
    const int which = var == variants ? 0 : var;
    const std::string what = fmt::format(
        "sm90 forward '{}' {} (seed {})",
        cuda::attention_fwd_bf16_sm90_variant_name(s.dim_qk, s.dim_v, which), case_name(s), seed);
    SCOPED_TRACE(what);
    cudatest::poison(out.p, out.bytes + kGuard, stream);
    cudatest::poison(lse.p, lse.bytes + kGuard, stream);
    ASSERT_TRUE(cuda::attention_fwd_bf16_sm90(s, q.p, k.p, v.p, out.p, static_cast<float*>(lse.p),
                                              st, which))
        << "the sm90 kernel refused the shape (is this GPU compute capability 9.0?)";
    CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<uint8_t> ob = out.get(), lb = lse.get();
    for (size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(ob[out.bytes + i], 0xFF) << "out written past its end, byte " << i;
      ASSERT_EQ(lb[lse.bytes + i], 0xFF) << "lse written past its end, byte " << i;
    }
    std::vector<double> got_o(static_cast<size_t>(no)), got_l(static_cast<size_t>(nl));
    for (int64_t i = 0; i < no; ++i) {
      uint16_t u;
      std::memcpy(&u, &ob[size_t(i) * 2], 2);
      got_o[size_t(i)] = value(u);
    }
    for (int64_t i = 0; i < nl; ++i) {
      float f;
      std::memcpy(&f, &lb[size_t(i) * 4], 4);
      got_l[size_t(i)] = f;
    }
    expect_rel(got_o, ref.out, 1e-2, "out");
    double worst = 0;
    for (size_t i = 0; i < got_l.size(); ++i) {
      const double d = std::abs(got_l[i] - ref.lse[i]);
      if (!(d <= worst)) worst = d;  // NaN propagates
    }
    EXPECT_LE(worst, 1e-4) << "lse: max |got − ref|";
    if (var == 0) {
      first_out.assign(ob.begin(), ob.begin() + ptrdiff_t(out.bytes));
      first_lse.assign(lb.begin(), lb.begin() + ptrdiff_t(lse.bytes));
    } else if (var == variants) {
      EXPECT_TRUE(std::equal(first_out.begin(), first_out.end(), ob.begin()) &&
                  std::equal(first_lse.begin(), first_lse.end(), lb.begin()))
          << "the default variant differs bitwise between two runs";
    }
  }
}

AttnShape shape(int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t dqk, bool causal) {
  return {b, s, hq, hkv, dqk, 128, 1.0 / std::sqrt(double(dqk)), causal};
}

TEST(CudaAttentionSm90, EveryVariantMatchesFloat64Reference) {
  const uint64_t seed = cudatest::fresh_seed();
  const AttnShape cases[] = {
      shape(2, 200, 4, 2, 192, true),   // GQA, one full and one partial query tile
      shape(1, 333, 3, 1, 192, false),  // non-causal, odd S, three q heads on one kv head
      shape(3, 129, 2, 2, 128, true),   // one row past a tile
      shape(1, 1, 1, 1, 128, true),     // a single row
      shape(1, 1, 3, 3, 192, false),    // a single row, non-causal
      shape(1, 50, 5, 5, 192, true),    // S below one consumer's 64 rows, B·H = 5
      shape(1, 517, 2, 1, 128, false),  // five key tiles, the last one partial
      shape(1, 1000, 2, 2, 192, true),  // eight key tiles: both stages wrap four times
      shape(2, 384, 4, 4, 128, true),   // exact tile multiples
      shape(1, 300, 8, 2, 128, true)};  // GQA 4:1
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(case_name(cases[i]));
    check_shape(cases[i], seed + i);
  }
}

// ---- the backward kernels
// ----------------------------------------------------------------------

struct BwdRef {
  std::vector<double> dq, dk, dv;
};

// FA2's backward in float64 from the reference forward: P = exp(scale q kᵀ - lse), dV = Pᵀ dO,
// dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = scale dS K, dK = scale dSᵀ Q (GQA heads summed).
BwdRef reference_bwd(const AttnShape& s, const std::vector<uint16_t>& q,
                     const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                     const std::vector<uint16_t>& dout, const Ref& f) {
  const int64_t S = s.seq, Hq = s.heads_q, Hk = s.heads_kv, Dq = s.dim_qk, Dv = s.dim_v;
  BwdRef r{std::vector<double>(q.size()), std::vector<double>(k.size()),
           std::vector<double>(v.size())};
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return size_t(((b * S + i) * Hq + h)); };
  auto ki = [&](int64_t b, int64_t j, int64_t g) { return size_t(((b * S + j) * Hk + g)); };
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hk);
      for (int64_t i = 0; i < S; ++i) {
        double dlt = 0;
        for (int64_t d = 0; d < Dv; ++d)
          dlt += value(dout[qi(b, i, h) * Dv + d]) * f.out[qi(b, i, h) * Dv + d];
        const double lse = f.lse[size_t((b * Hq + h) * S + i)];
        for (int64_t j = 0; j < (s.causal ? i + 1 : S); ++j) {
          double sc = 0, dp = 0;
          for (int64_t d = 0; d < Dq; ++d)
            sc += value(q[qi(b, i, h) * Dq + d]) * value(k[ki(b, j, g) * Dq + d]);
          for (int64_t d = 0; d < Dv; ++d)
            dp += value(dout[qi(b, i, h) * Dv + d]) * value(v[ki(b, j, g) * Dv + d]);
          const double pr = std::exp(sc * s.scale - lse), ds = pr * (dp - dlt) * s.scale;
          for (int64_t d = 0; d < Dv; ++d)
            r.dv[ki(b, j, g) * Dv + d] += pr * value(dout[qi(b, i, h) * Dv + d]);
          for (int64_t d = 0; d < Dq; ++d) {
            r.dq[qi(b, i, h) * Dq + d] += ds * value(k[ki(b, j, g) * Dq + d]);
            r.dk[ki(b, j, g) * Dq + d] += ds * value(q[qi(b, i, h) * Dq + d]);
          }
        }
      }
    }
  return r;
}

std::vector<double> bf16_values(const std::vector<uint8_t>& raw, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t u;
    std::memcpy(&u, &raw[i * 2], 2);
    out[i] = value(u);
  }
  return out;
}

void check_backward(const AttnShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random = [&](int64_t n, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = bits(u(rng));
    return v;
  };
  const int64_t nq = s.batch * s.seq * s.heads_q * s.dim_qk, nk = s.batch * s.seq * s.heads_kv;
  const int64_t no = s.batch * s.seq * s.heads_q * s.dim_v, nl = s.batch * s.heads_q * s.seq;
  const auto hq = random(nq, -2, 2), hk = random(nk * s.dim_qk, -2, 2);
  const auto hv = random(nk * s.dim_v, -1, 1), hdo = random(no, -1, 1);
  const Ref f = reference(s, hq, hk, hv);
  const BwdRef ref = reference_bwd(s, hq, hk, hv, hdo, f);
  // The backward reads the forward's outputs: out as bf16, lse as fp32.
  std::vector<uint16_t> ho(size_t(no), 0);
  for (size_t i = 0; i < ho.size(); ++i) ho[i] = bits(f.out[i]);
  std::vector<float> hl(f.lse.begin(), f.lse.end());
  Buf q(size_t(nq) * 2), k(size_t(nk * s.dim_qk) * 2), v(size_t(nk * s.dim_v) * 2);
  Buf out(size_t(no) * 2), dout(size_t(no) * 2), lse(size_t(nl) * 4);
  Buf dq(q.bytes), dk(k.bytes), dv(v.bytes);
  for (auto [buf, host] : {std::pair{&q, &hq}, {&k, &hk}, {&v, &hv}, {&out, &ho}, {&dout, &hdo}})
    upload(*buf, *host);
  CUDA_CHECK(cudaMemcpy(lse.p, hl.data(), lse.bytes, cudaMemcpyHostToDevice));
  Stream& stream = cudatest::cuda_backend().stream(0);
  auto st = static_cast<cudaStream_t>(stream.native_handle());
  const int variants = cuda::attention_bwd_bf16_sm90_num_variants(s.dim_qk, s.dim_v);
  ASSERT_GE(variants, 2) << case_name(s) << ": a deterministic and an atomic-dQ variant";
  size_t ws_bytes = 0;
  for (int var = 0; var < variants; ++var)
    ws_bytes = std::max(ws_bytes, cuda::attention_bwd_bf16_sm90_workspace_bytes(s, var));
  Buf ws(ws_bytes);
  std::vector<uint8_t> first[3];
  for (int var = 0; var <= variants; ++var) {  // the last pass repeats the default
    const int which = var == variants ? 0 : var;
    SCOPED_TRACE(fmt::format("sm90 backward '{}' {} (seed {})",
                             cuda::attention_bwd_bf16_sm90_variant_name(s.dim_qk, s.dim_v, which),
                             case_name(s), seed));
    Buf* outs[3] = {&dq, &dk, &dv};
    for (Buf* o : outs) cudatest::poison(o->p, o->bytes + kGuard, stream);
    cudatest::poison(ws.p, ws.bytes + kGuard, stream);
    ASSERT_TRUE(cuda::attention_bwd_bf16_sm90(s, q.p, k.p, v.p, out.p,
                                              static_cast<const float*>(lse.p), dout.p, dq.p, dk.p,
                                              dv.p, static_cast<float*>(ws.p), st, which))
        << "the sm90 backward refused the shape (is this GPU compute capability 9.0?)";
    CUDA_CHECK(cudaStreamSynchronize(st));
    const char* names[3] = {"dq", "dk", "dv"};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    for (int o = 0; o < 3; ++o) {
      const std::vector<uint8_t> raw = outs[o]->get();
      for (size_t i = 0; i < kGuard; ++i)
        ASSERT_EQ(raw[outs[o]->bytes + i], 0xFF) << names[o] << " written past its end, byte " << i;
      expect_rel(bf16_values(raw, outs[o]->bytes / 2), *want[o], 1e-2, names[o]);
      if (var == 0) {
        first[o].assign(raw.begin(), raw.begin() + ptrdiff_t(outs[o]->bytes));
      } else if (var == variants) {
        EXPECT_TRUE(std::equal(first[o].begin(), first[o].end(), raw.begin()))
            << names[o] << ": the default (deterministic) variant differs bitwise between runs";
      }
    }
  }
}

TEST(CudaAttentionSm90, BackwardEveryVariantMatchesFloat64Reference) {
  const uint64_t seed = cudatest::fresh_seed();
  const AttnShape cases[] = {
      shape(2, 200, 4, 2, 192, true),   // GQA, one full and one partial key tile
      shape(1, 333, 3, 1, 192, false),  // non-causal, odd S, three q heads on one kv head
      shape(3, 129, 2, 2, 128, true),   // one row past a tile
      shape(1, 50, 5, 5, 192, true),    // S below one warpgroup's 64 rows, B·H = 5
      shape(1, 517, 2, 1, 128, false),  // five key tiles, the last one partial
      shape(1, 1000, 2, 2, 192, true),  // eight key tiles: both stages wrap many times
      shape(1, 256, 2, 2, 128, true),   // exact tile multiples
      shape(1, 300, 8, 2, 128, true)};  // GQA 4:1: four heads walked per kv-head CTA
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(case_name(cases[i]));
    check_backward(cases[i], seed + 100 + i);
  }
}

TEST(CudaAttentionSm90, RefusesWhatItCannotRun) {
  Buf a(1 << 16), b(1 << 16), c(1 << 16), d(1 << 16), l(1 << 16);
  cudaStream_t st = static_cast<cudaStream_t>(cudatest::cuda_backend().stream(0).native_handle());
  auto runs = [&](const AttnShape& s, const void* q) {
    return cuda::attention_fwd_bf16_sm90(s, q, b.p, c.p, d.p, static_cast<float*>(l.p), st);
  };
  EXPECT_EQ(cuda::attention_fwd_bf16_sm90_num_variants(64, 64), 0);
  EXPECT_GT(cuda::attention_fwd_bf16_sm90_num_variants(192, 128), 0);
  EXPECT_GT(cuda::attention_fwd_bf16_sm90_num_variants(128, 128), 0);
  EXPECT_FALSE(runs({1, 16, 2, 2, 64, 64, 0.125, true}, a.p)) << "head dims (64, 64)";
  EXPECT_FALSE(runs({1, 16, 3, 2, 128, 128, 0.1, true}, a.p)) << "heads_q not a multiple";
  EXPECT_FALSE(runs({1, 16, 2, 2, 128, 128, 0.1, true}, static_cast<char*>(a.p) + 2))
      << "q not 16-byte aligned";
  EXPECT_TRUE(runs({1, 16, 2, 2, 128, 128, 0.1, true}, a.p)) << "a shape it has";
  EXPECT_EQ(cuda::attention_bwd_bf16_sm90_num_variants(64, 64), 0);
  EXPECT_FALSE(cuda::attention_bwd_bf16_sm90_supports({1, 16, 2, 2, 64, 64, 0.125, true}));
  EXPECT_FALSE(cuda::attention_bwd_bf16_sm90_supports({1, 16, 3, 2, 128, 128, 0.1, true}));
  EXPECT_TRUE(cuda::attention_bwd_bf16_sm90_supports({1, 16, 2, 2, 192, 128, 0.1, true}));
  CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace
}  // namespace meshtrain
