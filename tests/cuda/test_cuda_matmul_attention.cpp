// CUDA matmul and attention against the CPU reference: each graph runs on the "cpu" backend in
// float64 and on "cuda" in bf16 / float32 / float64, from the same fresh random inputs (rounded to
// the CUDA dtype first, so only kernel arithmetic differs). Every CUDA buffer is poisoned with NaN
// before the run, so an unwritten element fails as "nan". Tolerances (‖got − ref‖ / ‖ref‖ and
// max |got − ref| / rms(ref)) are stated per dtype in kTol below; bitwise repeatability is
// asserted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"
#include "op_harness.h"

namespace meshtrain {

// gtest prints parameters with this (dtype names instead of raw bytes).
inline void PrintTo(DType d, std::ostream* os) { *os << dtype_name(d); }

namespace {

using BuildFn = std::function<std::vector<ValueId>(Builder&, const std::vector<ValueId>&)>;

struct Host {
  Shape shape;
  std::vector<double> v;
};

using cudatest::fresh_seed;  // MESHTRAIN_TEST_SEED reproduces a failing case (op_harness.h)

// Uniform in [lo, hi), rounded to `dtype` (never zero-filled: a zero would hide unwritten output).
Host random_host(const Shape& shape, DType dtype, std::mt19937_64& rng, double lo = -1,
                 double hi = 1) {
  Host h{shape, std::vector<double>(size_t(shape.numel()))};
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& x : h.v) {
    x = u(rng);
    if (dtype == DType::kBF16) x = float(BFloat16(float(x)));
    if (dtype == DType::kF32) x = double(float(x));
  }
  return h;
}

std::vector<uint8_t> to_bytes(const std::vector<double>& v, DType d) {
  std::vector<uint8_t> out(v.size() * dtype_size(d));
  for (size_t i = 0; i < v.size(); ++i) {
    if (d == DType::kF64) {
      std::memcpy(&out[i * 8], &v[i], 8);
    } else if (d == DType::kF32) {
      const float f = float(v[i]);
      std::memcpy(&out[i * 4], &f, 4);
    } else if (d == DType::kBF16) {
      const uint16_t b = BFloat16::from_float(float(v[i]));
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      MT_THROW(ValueError, "test: unsupported dtype {}", dtype_name(d));
    }
  }
  return out;
}

std::vector<double> from_bytes(const std::vector<uint8_t>& b, DType d, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (size_t k = 0; k < out.size(); ++k) {
    if (d == DType::kF64) {
      std::memcpy(&out[k], &b[k * 8], 8);
    } else if (d == DType::kF32) {
      float f;
      std::memcpy(&f, &b[k * 4], 4);
      out[k] = f;
    } else {
      uint16_t u;
      std::memcpy(&u, &b[k * 2], 2);
      out[k] = BFloat16::to_float(u);
    }
  }
  return out;
}

std::vector<double> nan_fill(int64_t n) {
  return std::vector<double>(size_t(n), std::numeric_limits<double>::quiet_NaN());
}

struct RunResult {
  std::vector<Host> outs;                    // outputs, then gradients (when asked)
  std::vector<std::vector<uint8_t>> raw[2];  // raw output bytes of the first and second run
};

// Builds `build` over inputs of `dtype`; with `weights` (one per output) appends
// loss = Σ sum(out_i ⊙ w_i) and returns d loss / d input for every input after the outputs.
// Runs twice on the same executor so callers can check bitwise repeatability.
RunResult run_graph(const std::string& backend_name, DType dtype, const std::vector<Host>& inputs,
                    const BuildFn& build, const std::vector<Host>* weights = nullptr) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(b.input(fmt::format("x{}", i), {inputs[i].shape, dtype}));
  std::vector<ValueId> outs = build(b, ins);
  std::vector<ValueId> ws;
  if (weights) {
    ValueId loss = kNoValue;
    for (size_t i = 0; i < outs.size(); ++i) {
      ws.push_back(b.input(fmt::format("w{}", i), b.meta(outs[i])));
      ValueId term = ops::sum(b, ops::mul(b, outs[i], ws.back()));
      loss = loss == kNoValue ? term : ops::add(b, loss, term);
    }
    GradientMap grads = differentiate(g, loss, ins);
    for (ValueId x : ins) {
      MT_CHECK(grads.grad_of(x) != kNoValue, "test: input has no gradient");
      outs.push_back(grads.grad_of(x));
    }
  }
  for (ValueId o : outs) g.mark_output(o);
  eliminate_dead_nodes(g);

  auto backend = create_backend(backend_name, 0);
  Executor ex(g, plan_memory(g, backend->device().type), *backend, nullptr);
  ex.prepare();
  Stream& s = backend->stream(0);
  auto upload = [&](const Tensor& t, const std::vector<double>& v) {
    std::vector<uint8_t> bytes = to_bytes(v, t.dtype());
    backend->copy(t.raw(), bytes.data(), bytes.size(), CopyKind::kHostToDevice, s);
    backend->synchronize();  // `bytes` is pageable host memory that dies at scope end
  };
  // Poison every activation (outputs included) so unwritten elements read back as NaN.
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (ex.plan().region[size_t(v)] == MemRegion::kArena && g.value(v).alias_of == kNoValue &&
        is_floating(g.value(v).meta.dtype))
      upload(ex.tensor(v), nan_fill(g.value(v).meta.numel()));
  for (size_t i = 0; i < ins.size(); ++i) upload(ex.tensor(ins[i]), inputs[i].v);
  for (size_t i = 0; i < ws.size(); ++i) upload(ex.tensor(ws[i]), (*weights)[i].v);

  RunResult r;
  for (int run = 0; run < 2; ++run) {
    ex.run();
    backend->synchronize();
    for (ValueId o : outs) {
      const Tensor& t = ex.tensor(o);
      std::vector<uint8_t> bytes(t.nbytes());
      backend->copy(bytes.data(), t.raw(), bytes.size(), CopyKind::kDeviceToHost, s);
      backend->synchronize();
      r.raw[run].push_back(std::move(bytes));
    }
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorMeta& m = g.value(outs[i]).meta;
    r.outs.push_back({m.shape, from_bytes(r.raw[0][i], m.dtype, m.numel())});
  }
  // Every caller compares a GPU run with the CPU's (a failed comparison fails the test, which then
  // skips the coverage verification).
  if (backend_name == "cuda") cudatest::note_compared_graph(g);
  return r;
}

struct Tol {
  double rel_l2, max_over_rms;
  // Absolute floor under rms(ref): a reference that is exactly zero (dq of a single-row attention,
  // where the softmax has one entry and no gradient) still allows rounding noise of this size.
  double abs_floor = 0;
};
// fp32 GEMM: 1e-5, widened for long reductions (see fp32_gemm_tol). bf16 GEMM: the bf16 output
// rounding alone is 2^-9 per element (~1.1e-3 in L2). Attention bf16: P and dS are rounded to bf16
// before their products (FA2), the outputs to bf16 too. lse is compared by absolute error (it is
// fp32 for bf16 inputs).
constexpr Tol kTolMatmulF32{1e-5, 1e-5}, kTolMatmulBF16{5e-3, 2e-2}, kTolF64{1e-10, 1e-10};
constexpr Tol kTolAttnF32{1e-4, 1e-4, 1e-7}, kTolAttnBF16{1e-2, 5e-2},
    kTolAttnGradBF16{2e-2, 1e-1, 1e-5};

std::string index_str(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(size_t(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[size_t(d)] = flat % s[d];
    flat /= s[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// Fails with: which output, the error measures, the worst element and the first NaN.
void expect_close(const Host& got, const Host& ref, Tol tol, const std::string& what) {
  ASSERT_EQ(got.v.size(), ref.v.size()) << what;
  double diff2 = 0, ref2 = 0, max_abs = 0;
  int64_t worst = -1, first_nan = -1, nans = 0;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    if (std::isnan(got.v[i])) {
      if (first_nan < 0) first_nan = int64_t(i);
      ++nans;
      continue;
    }
    const double d = std::abs(got.v[i] - ref.v[i]);
    diff2 += d * d;
    ref2 += ref.v[i] * ref.v[i];
    if (d > max_abs) max_abs = d, worst = int64_t(i);
  }
  EXPECT_EQ(nans, 0) << what << ": " << nans << " of " << ref.v.size()
                     << " elements are NaN (unwritten or poisoned), first at "
                     << index_str(ref.shape, first_nan);
  if (ref.v.empty() || nans > 0) return;
  const double rms = std::max(std::sqrt(ref2 / double(ref.v.size())), tol.abs_floor);
  const double ref_l2 = std::max(std::sqrt(ref2), tol.abs_floor * std::sqrt(double(ref.v.size())));
  const double rel = std::sqrt(diff2) / std::max(ref_l2, 1e-300);
  const std::string at =
      worst >= 0 ? fmt::format("worst at {}: got {} ref {}", index_str(ref.shape, worst),
                               got.v[size_t(worst)], ref.v[size_t(worst)])
                 : "";
  EXPECT_LE(rel, tol.rel_l2) << what << " " << ref.shape.to_string()
                             << ": ‖got−ref‖/‖ref‖ = " << rel << "; " << at;
  EXPECT_LE(max_abs, tol.max_over_rms * rms)
      << what << " " << ref.shape.to_string() << ": max |got−ref| = " << max_abs << " = "
      << max_abs / std::max(rms, 1e-300) << " × rms(ref) " << rms << "; " << at;
}

void expect_abs(const Host& got, const Host& ref, double tol, const std::string& what) {
  double max_abs = 0;
  int64_t worst = -1;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    const double d = std::isnan(got.v[i]) ? INFINITY : std::abs(got.v[i] - ref.v[i]);
    if (d > max_abs || worst < 0) max_abs = d, worst = int64_t(i);
  }
  if (worst < 0) return;
  EXPECT_LE(max_abs, tol) << what << ": max |got−ref| = " << max_abs << " at "
                          << index_str(ref.shape, worst) << " (got " << got.v[size_t(worst)]
                          << ", ref " << ref.v[size_t(worst)] << ")";
}

void expect_repeatable(const RunResult& r, const std::string& what) {
  for (size_t i = 0; i < r.raw[0].size(); ++i)
    EXPECT_TRUE(r.raw[0][i] == r.raw[1][i])
        << what << ": output " << i << " differs bitwise between two runs of the same graph";
}

// ---- matmul -------------------------------------------------------------------------------------

struct MmCase {
  Shape a, b;
  bool ta, tb;
};

Tol matmul_tol(DType d) {
  return d == DType::kBF16 ? kTolMatmulBF16 : d == DType::kF32 ? kTolMatmulF32 : kTolF64;
}

// A dot product of length K accumulated in sequence in fp32 has relative error ~ 2^-24 sqrt(K)
// (random-walk rounding); at K = 16384 that is 7.6e-6, too close to 1e-5 for a max-error test.
// So fp32 gets max(1e-5, 3 sigma) in L2 and max(1e-5, 15 sigma) on the worst element.
Tol fp32_gemm_tol(int64_t longest_reduction) {
  const double sigma = std::ldexp(1.0, -24) * std::sqrt(double(longest_reduction));
  return {std::max(kTolMatmulF32.rel_l2, 3 * sigma),
          std::max(kTolMatmulF32.max_over_rms, 15 * sigma)};
}

void check_matmul(const MmCase& c, DType dtype, Tol tol, uint64_t seed, bool with_grad = false) {
  std::mt19937_64 rng(seed);
  std::vector<Host> in{random_host(c.a, dtype, rng), random_host(c.b, dtype, rng)};
  BuildFn build = [&](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::matmul(b, x[0], x[1], c.ta, c.tb)};
  };
  std::vector<Host> w;
  if (with_grad) {
    Graph probe;
    Builder pb(probe);
    ValueId o =
        ops::matmul(pb, pb.input("a", {c.a, dtype}), pb.input("b", {c.b, dtype}), c.ta, c.tb);
    w.push_back(random_host(pb.shape(o), dtype, rng));
  }
  if (dtype == DType::kF32) {
    const ops::MatmulDims d = ops::matmul_dims({c.a, dtype}, {c.b, dtype}, c.ta, c.tb);
    tol = fp32_gemm_tol(with_grad ? std::max({d.m, d.n, d.k}) : d.k);  // dA sums over n, dB over m
  }
  RunResult ref = run_graph("cpu", DType::kF64, in, build, with_grad ? &w : nullptr);
  RunResult got = run_graph("cuda", dtype, in, build, with_grad ? &w : nullptr);
  const std::string what = fmt::format("matmul {} A{}{} B{}{} (seed {})", dtype_name(dtype), c.a,
                                       c.ta ? "ᵀ" : "", c.b, c.tb ? "ᵀ" : "", seed);
  const char* names[] = {"out", "dA", "dB"};
  for (size_t i = 0; i < ref.outs.size(); ++i)
    expect_close(got.outs[i], ref.outs[i], tol, what + " " + names[i]);
  expect_repeatable(got, what);
}

class CudaMatmul : public ::testing::TestWithParam<DType> {};

MT_DECLARE_CHECKS(::meshtrain::testing::Check::kCudaVsCpu, CudaMatmul, AllTransposeCases, "matmul");
TEST_P(CudaMatmul, AllTransposeCases) {
  MT_COVERAGE_SCOPE(::meshtrain::testing::Check::kCudaVsCpu, CudaMatmul, AllTransposeCases);
  const uint64_t seed = fresh_seed();
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{96, 80, 72}, {33, 65, 40}}) {
        MmCase c{ta ? Shape{k, m} : Shape{m, k}, tb ? Shape{n, k} : Shape{k, n}, ta, tb};
        check_matmul(c, GetParam(), matmul_tol(GetParam()), seed + uint64_t(m));
      }
}

TEST_P(CudaMatmul, LeadingDimsFlatten) {
  const uint64_t seed = fresh_seed();
  check_matmul({Shape{2, 3, 40, 64}, Shape{64, 48}, false, false}, GetParam(),
               matmul_tol(GetParam()), seed);
  check_matmul({Shape{2, 3, 40, 64}, Shape{48, 64}, false, true}, GetParam(),
               matmul_tol(GetParam()), seed + 1);
  // transpose_a flattens A to [20, 24] and yields [24, 16].
  check_matmul({Shape{4, 5, 24}, Shape{20, 16}, true, false}, GetParam(), matmul_tol(GetParam()),
               seed + 2);
}

// K, M, N not multiples of 8: cuBLASLt may offer no algorithm (bf16 leading dims), in which case
// the plan falls back to cublasGemmEx. Either way the result must be right.
TEST_P(CudaMatmul, OddExtentsUseAWorkingPath) {
  const uint64_t seed = fresh_seed();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 7, n = 9, k = 13;
      check_matmul({ta ? Shape{k, m} : Shape{m, k}, tb ? Shape{n, k} : Shape{k, n}, ta, tb},
                   GetParam(), matmul_tol(GetParam()), seed + (ta ? 2 : 0) + (tb ? 1 : 0));
    }
}

TEST_P(CudaMatmul, LargeAndSplitKShapesAreRightAndRepeatable) {
  const uint64_t seed = fresh_seed();
  check_matmul({Shape{512, 1024}, Shape{768, 1024}, false, true}, GetParam(),
               matmul_tol(GetParam()), seed);
  // Long K with a small output: the shape cuBLASLt serves with split-K.
  check_matmul({Shape{16384, 64}, Shape{16384, 64}, true, false}, GetParam(),
               matmul_tol(GetParam()), seed + 1);
}

TEST_P(CudaMatmul, BackwardThroughAutodiff) {
  const uint64_t seed = fresh_seed();
  check_matmul({Shape{2, 16, 48}, Shape{32, 48}, false, true}, GetParam(), matmul_tol(GetParam()),
               seed, /*with_grad=*/true);
  check_matmul({Shape{40, 24}, Shape{40, 16}, true, false}, GetParam(), matmul_tol(GetParam()),
               seed + 1, /*with_grad=*/true);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMatmul,
                         ::testing::Values(DType::kBF16, DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaMatmulErrors, IntegerDtypeIsRejectedAtPrepare) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", {Shape{4, 4}, DType::kI64});
  ValueId c = ops::matmul(b, a, b.input("b", {Shape{4, 4}, DType::kI64}));
  g.mark_output(c);
  auto backend = create_backend("cuda", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCUDA), *backend, nullptr);
  try {
    ex.prepare();
    FAIL() << "matmul on int64 prepared on CUDA";
  } catch (const ValueError& e) {
    EXPECT_NE(
        std::string(e.what()).find("expected dtype bfloat16, float32 or float64, found int64"),
        std::string::npos)
        << e.what();
  }
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnCase {
  int64_t B, S, Hq, Hkv, Dqk, Dv;
  bool causal;
  std::string str() const {
    return fmt::format("B{} S{} Hq{} Hkv{} Dqk{} Dv{} {}", B, S, Hq, Hkv, Dqk, Dv,
                       causal ? "causal" : "non-causal");
  }
  Shape q() const { return Shape{B, S, Hq, Dqk}; }
  Shape k() const { return Shape{B, S, Hkv, Dqk}; }
  Shape v() const { return Shape{B, S, Hkv, Dv}; }
  Shape o() const { return Shape{B, S, Hq, Dv}; }
  double scale() const { return 1.0 / std::sqrt(double(Dqk)); }
};

// q, k in [-2, 2) so the scores (std ~1.3) give a peaked softmax; v, dout in [-1, 1).
std::vector<Host> attn_inputs(const AttnCase& c, DType dtype, uint64_t seed, bool with_dout) {
  std::mt19937_64 rng(seed);
  std::vector<Host> in{random_host(c.q(), dtype, rng, -2, 2), random_host(c.k(), dtype, rng, -2, 2),
                       random_host(c.v(), dtype, rng)};
  if (with_dout) in.push_back(random_host(c.o(), dtype, rng));
  return in;
}

struct AttnTol {
  Tol out, grad;
  double lse_abs;
};
AttnTol attn_tol(DType d) {
  if (d == DType::kBF16) return {kTolAttnBF16, kTolAttnGradBF16, 1e-4};
  if (d == DType::kF32) return {kTolAttnF32, kTolAttnF32, 1e-4};
  return {kTolF64, kTolF64, 1e-10};
}

// out, lse and the fused backward (dout a graph input): exercises only the attention kernels.
// `kernel` kAuto takes cuDNN where the build has it and it takes the case, kMeshtrain never.
void check_attention(const AttnCase& c, DType dtype, uint64_t seed,
                     ops::AttentionKernel kernel = ops::AttentionKernel::kAuto) {
  const std::vector<Host> in = attn_inputs(c, dtype, seed, true);
  BuildFn build = [&](Builder& b, const std::vector<ValueId>& x) {
    ops::AttentionOutputs o = ops::attention(b, x[0], x[1], x[2], c.scale(), c.causal, kernel);
    ops::AttentionGrads g = ops::attention_backward(b, x[0], x[1], x[2], o.out, o.lse, x[3],
                                                    c.scale(), c.causal, kernel);
    return std::vector<ValueId>{o.out, o.lse, g.dq, g.dk, g.dv};
  };
  RunResult ref = run_graph("cpu", DType::kF64, in, build);
  RunResult got = run_graph("cuda", dtype, in, build);
  const std::string what = fmt::format("attention {} {} kernels {} (seed {})", dtype_name(dtype),
                                       c.str(), ops::attention_kernel_name(kernel), seed);
  const AttnTol tol = attn_tol(dtype);
  expect_close(got.outs[0], ref.outs[0], tol.out, what + " out");
  expect_abs(got.outs[1], ref.outs[1], tol.lse_abs, what + " lse");
  expect_close(got.outs[2], ref.outs[2], tol.grad, what + " dq");
  expect_close(got.outs[3], ref.outs[3], tol.grad, what + " dk");
  expect_close(got.outs[4], ref.outs[4], tol.grad, what + " dv");
  expect_repeatable(got, what);
}

class CudaAttention : public ::testing::TestWithParam<DType> {};

MT_DECLARE_CHECKS(::meshtrain::testing::Check::kCudaVsCpu, CudaAttention,
                  ForwardAndBackwardMatchCpu, "attention", "attention_backward");
TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  MT_COVERAGE_SCOPE(::meshtrain::testing::Check::kCudaVsCpu, CudaAttention,
                    ForwardAndBackwardMatchCpu);
  const uint64_t seed = fresh_seed();
  std::vector<AttnCase> cases;
  if (GetParam() == DType::kBF16) {
    cases = {{2, 200, 4, 2, 192, 128, true},   // GQA, S not a multiple of any tile
             {1, 300, 2, 2, 128, 128, false},  // non-causal
             {2, 129, 4, 1, 64, 64, true},     // one kv head for four q heads
             {1, 1024, 2, 1, 192, 128, true},  // many tiles, causal skipping
             {1, 128, 2, 2, 128, 128, true},   // exact tile multiples
             {1, 1, 1, 1, 64, 64, false},      // a single row
             {2, 70, 4, 2, 16, 16, true},      // no tensor-core kernel (llama3 debugmodel dims):
             {1, 50, 2, 1, 96, 80, false}};    // the CUDA-core fallback, same tolerances
  } else if (GetParam() == DType::kF32) {
    cases = {{2, 77, 4, 2, 192, 128, true},
             {1, 50, 2, 2, 128, 128, false},
             {1, 33, 3, 1, 40, 24, true}};  // head dims the bf16 kernels do not have
  } else {
    cases = {{1, 40, 2, 1, 64, 32, true}, {1, 19, 2, 2, 24, 40, false}};
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    check_attention(cases[i], GetParam(), seed + i);
    // meshtrain's own kernels stay covered where auto picks cuDNN.
    if (GetParam() == DType::kBF16)
      check_attention(cases[i], GetParam(), seed + i, ops::AttentionKernel::kMeshtrain);
  }
}

TEST_P(CudaAttention, BackwardThroughAutodiff) {
  const AttnCase c = GetParam() == DType::kBF16 ? AttnCase{1, 160, 4, 2, 192, 128, true}
                                                : AttnCase{1, 45, 4, 2, 64, 64, true};
  const uint64_t seed = fresh_seed();
  std::vector<Host> in = attn_inputs(c, GetParam(), seed, true);
  std::vector<Host> w{in.back()};  // the weights of the loss are dout
  in.pop_back();
  BuildFn build = [&](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::attention(b, x[0], x[1], x[2], c.scale(), c.causal).out};
  };
  RunResult ref = run_graph("cpu", DType::kF64, in, build, &w);
  RunResult got = run_graph("cuda", GetParam(), in, build, &w);
  const std::string what =
      fmt::format("attention autodiff {} {} (seed {})", dtype_name(GetParam()), c.str(), seed);
  const AttnTol tol = attn_tol(GetParam());
  expect_close(got.outs[0], ref.outs[0], tol.out, what + " out");
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < 3; ++i)
    expect_close(got.outs[1 + i], ref.outs[1 + i], tol.grad, what + " " + names[i]);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttention,
                         ::testing::Values(DType::kBF16, DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// [model] attention_backend = "cudnn" insists: with cuDNN in the build it runs the equal-heads case
// (matching the CPU) and refuses grouped kv heads naming the key; without cuDNN it refuses at once.
TEST(CudaAttentionBackend, CudnnChoiceRunsOrSaysWhyNot) {
  const uint64_t seed = fresh_seed();
  const AttnCase equal{1, 256, 2, 2, 128, 128, true}, grouped{1, 256, 4, 2, 128, 128, true};
  auto expect_refused = [&](const AttnCase& c, const std::string& needle) {
    try {
      check_attention(c, DType::kBF16, seed, ops::AttentionKernel::kCudnn);
      ADD_FAILURE() << "attention_backend cudnn ran " << c.str();
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  if (cuda::attention_library() == nullptr) {
    expect_refused(equal, "this build has no cuDNN");
    return;
  }
  check_attention(equal, DType::kBF16, seed, ops::AttentionKernel::kCudnn);
  expect_refused(grouped, "attention_backend = \"cudnn\", but cudnn refuses this node");
}

// Every compiled forward tile variant (bench_attention may promote any of them to the default)
// against the CPU, through the raw launcher.
TEST(CudaAttentionVariants, EveryForwardVariantMatchesCpu) {
  const uint64_t seed = fresh_seed();
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{192, 128}, {128, 128}, {64, 64}})
    for (bool causal : {true, false}) {
      const AttnCase c{2, 333, 4, 2, dqk, dv, causal};
      const std::vector<Host> in = attn_inputs(c, DType::kBF16, seed, false);
      BuildFn build = [&](Builder& b, const std::vector<ValueId>& x) {
        ops::AttentionOutputs o = ops::attention(b, x[0], x[1], x[2], c.scale(), c.causal);
        return std::vector<ValueId>{o.out, o.lse};
      };
      RunResult ref = run_graph("cpu", DType::kF64, in, build);
      auto backend = create_backend("cuda", 0);
      Stream& s = backend->stream(0);
      auto device = [&](size_t bytes) {
        return std::shared_ptr<Storage>(std::make_shared<Storage>(backend->allocator(), bytes));
      };
      std::vector<std::shared_ptr<Storage>> bufs;
      for (const Host& h : in) {
        bufs.push_back(device(h.v.size() * 2));
        std::vector<uint8_t> bytes = to_bytes(h.v, DType::kBF16);
        backend->copy(bufs.back()->data(), bytes.data(), bytes.size(), CopyKind::kHostToDevice, s);
        backend->synchronize();
      }
      const int64_t n_out = c.o().numel(), n_lse = c.B * c.Hq * c.S;
      auto out = device(size_t(n_out) * 2), lse = device(size_t(n_lse) * 4);
      cuda::AttnShape shape{c.B, c.S, c.Hq, c.Hkv, c.Dqk, c.Dv, c.scale(), c.causal};
      const int variants = cuda::attention_fwd_bf16_num_variants(dqk, dv);
      ASSERT_GT(variants, 0) << c.str();
      for (int var = 0; var < variants; ++var) {
        std::vector<uint8_t> poison_o = to_bytes(nan_fill(n_out), DType::kBF16);
        std::vector<uint8_t> poison_l = to_bytes(nan_fill(n_lse), DType::kF32);
        backend->copy(out->data(), poison_o.data(), poison_o.size(), CopyKind::kHostToDevice, s);
        backend->copy(lse->data(), poison_l.data(), poison_l.size(), CopyKind::kHostToDevice, s);
        backend->synchronize();
        ASSERT_TRUE(cuda::attention_fwd_bf16(
            shape, bufs[0]->data(), bufs[1]->data(), bufs[2]->data(), out->data(),
            static_cast<float*>(lse->data()), static_cast<cudaStream_t>(s.native_handle()), var));
        std::vector<uint8_t> ob(size_t(n_out) * 2), lb(size_t(n_lse) * 4);
        backend->copy(ob.data(), out->data(), ob.size(), CopyKind::kDeviceToHost, s);
        backend->copy(lb.data(), lse->data(), lb.size(), CopyKind::kDeviceToHost, s);
        backend->synchronize();
        const std::string what =
            fmt::format("forward variant {} '{}' {} (seed {})", var,
                        cuda::attention_fwd_bf16_variant_name(dqk, dv, var), c.str(), seed);
        expect_close({c.o(), from_bytes(ob, DType::kBF16, n_out)}, ref.outs[0], kTolAttnBF16,
                     what + " out");
        expect_abs({Shape{c.B, c.Hq, c.S}, from_bytes(lb, DType::kF32, n_lse)}, ref.outs[1], 1e-4,
                   what + " lse");
      }
    }
}

void expect_prepare_error(DType dtype, const AttnCase& c, double scale, const std::string& needle) {
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", {c.q(), dtype}), k = b.input("k", {c.k(), dtype});
  ValueId v = b.input("v", {c.v(), dtype});
  g.mark_output(ops::attention(b, q, k, v, scale, c.causal).out);
  auto backend = create_backend("cuda", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCUDA), *backend, nullptr);
  try {
    ex.prepare();
    FAIL() << "prepared an attention the CUDA kernels cannot run: " << c.str();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CudaAttentionErrors, HeadDimsOver256FailForBf16WithoutATensorCoreKernel) {
  expect_prepare_error(DType::kBF16, {1, 16, 2, 2, 320, 256, true}, 0.1,
                       "bfloat16 head dims (Dqk 320, Dv 256) need the CUDA-core kernel, which "
                       "supports head dims up to 256");
}

TEST(CudaAttentionErrors, NonPositiveScaleFailsAtPrepare) {
  expect_prepare_error(DType::kF32, {1, 16, 2, 2, 64, 64, true}, -0.5,
                       "softmax_scale must be positive and finite, found -0.5");
}

TEST(CudaAttentionErrors, HeadDimsOver256FailForFloat32) {
  expect_prepare_error(DType::kF32, {1, 8, 1, 1, 320, 64, false}, 0.1,
                       "float32 head dims (Dqk 320, Dv 64) need the CUDA-core kernel, which "
                       "supports head dims up to 256");
}

}  // namespace
}  // namespace meshtrain
