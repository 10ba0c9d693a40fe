// bench_gemm: bf16 GEMM through meshtrain's cuBLASLt plans (what the `matmul` op runs) against
// classic cublasGemmEx on the same operands, at square sizes and at the linear layers of
// Llama-3 8B and DeepSeek 16B (MLA, MoE shared experts) for --tokens tokens (forward x·Wᵀ, and the
// two backward products). FLOP = 2·m·n·k. Time = median of --iters launches after --warmup, CUDA
// events; random bf16 operands (never zeros). The ceilings: the 989.5 TFLOP/s datasheet peak and
// the best rate measured at 8192³ in this run.
//
//   build-cuda/bench/kernels/bench_gemm [--tokens 16384] [--iters 20] [--warmup 5] [--only NAME]
#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "meshtrain/ops/cuda/cublaslt_matmul.h"

using namespace meshtrain;
using namespace meshtrain::bench;

namespace {

struct Options {
  int64_t tokens = 16384;
  int iters = 20, warmup = 5;
  std::string only;
};

struct Shape3 {
  std::string name;
  int64_t m, n, k;
  bool ta, tb;
};

// A linear with weight [out, in] at T tokens: y = x Wᵀ, dx = dy W, dW = dyᵀ x.
void add_linear(std::vector<Shape3>& v, const std::string& name, int64_t out, int64_t in,
                int64_t t) {
  v.push_back({name + " fwd", t, out, in, false, true});
  v.push_back({name + " dgrad", t, in, out, false, false});
  v.push_back({name + " wgrad", out, in, t, true, false});
}

std::vector<Shape3> shapes(int64_t t) {
  std::vector<Shape3> v{{"square 4096", 4096, 4096, 4096, false, false},
                        {"square 8192", 8192, 8192, 8192, false, false}};
  // Llama-3 8B: dim 4096, 32 heads / 8 kv heads of 128, ffn 14336, vocab 128256.
  add_linear(v, "llama8b wq|wo", 4096, 4096, t);
  add_linear(v, "llama8b wk|wv", 1024, 4096, t);
  add_linear(v, "llama8b w1|w3", 14336, 4096, t);
  add_linear(v, "llama8b w2", 4096, 14336, t);
  v.push_back({"llama8b output fwd", t, 128256, 4096, false, true});
  // DeepSeek 16B: dim 2048, 16 heads, qk 128+64, v 128, kv_lora 512, dense ffn 10944, 2 shared
  // experts of 1408 (fused: 2816). Routed experts are grouped GEMMs, not timed here.
  add_linear(v, "dsv16b wq", 16 * 192, 2048, t);
  add_linear(v, "dsv16b wkv_a", 512 + 64, 2048, t);
  add_linear(v, "dsv16b wkv_b", 16 * 256, 512, t);
  add_linear(v, "dsv16b wo", 2048, 16 * 128, t);
  add_linear(v, "dsv16b dense w1|w3", 10944, 2048, t);
  add_linear(v, "dsv16b dense w2", 2048, 10944, t);
  add_linear(v, "dsv16b shared w1|w3", 2816, 2048, t);
  add_linear(v, "dsv16b shared w2", 2048, 2816, t);
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gemm: %s expects a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens")
      o.tokens = std::atoll(value().c_str());
    else if (a == "--iters")
      o.iters = std::max(1, std::atoi(value().c_str()));
    else if (a == "--warmup")
      o.warmup = std::max(0, std::atoi(value().c_str()));
    else if (a == "--only")
      o.only = value();
    else {
      std::fprintf(stderr,
                   "usage: bench_gemm [--tokens N] [--iters N] [--warmup N] [--only SUBSTRING]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

// Relative L2 difference of two bf16 device buffers (first `n` elements), on the host.
double rel_diff(const void* x, const void* y, size_t n) {
  n = std::min<size_t>(n, size_t(1) << 22);
  std::vector<uint16_t> a(n), b(n);
  CUDA_CHECK(cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), y, n * 2, cudaMemcpyDeviceToHost));
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double u = BFloat16::to_float(a[i]), w = BFloat16::to_float(b[i]);
    d2 += (u - w) * (u - w);
    r2 += w * w;
  }
  return std::isfinite(d2) ? std::sqrt(d2 / std::max(r2, 1e-300)) : INFINITY;
}

struct Row {
  Shape3 s;
  double lt_ms, ref_ms, diff;
  std::string algo;
};

Row measure(const Shape3& s, const Options& o, cudaStream_t stream, cublasHandle_t blas,
            const DeviceBuffer& ws) {
  const size_t a_elems = size_t(s.m * s.k), b_elems = size_t(s.k * s.n),
               c_elems = size_t(s.m * s.n);
  DeviceBuffer a(a_elems * 2), b(b_elems * 2), c(c_elems * 2), c_ref(c_elems * 2);
  fill_random_bf16(a.get(), a_elems, 1, 1.f, stream);
  fill_random_bf16(b.get(), b_elems, 2, 1.f, stream);
  const cuda::GemmProblem p = cuda::gemm_problem(DType::kBF16, s.ta, s.tb, s.m, s.n, s.k);
  auto plan = cuda::gemm_plan(0, p, cuda::kGemmWorkspaceBytes);
  Row r{s, 0, 0, 0, plan->describe()};
  r.lt_ms = time_it([&] { plan->run(a.get(), b.get(), c.get(), ws.get(), ws.bytes(), stream); },
                    stream, o.warmup, o.iters)
                .median_ms;
  // Classic cuBLAS on the same column-major mapping (C^T = op(B)^T op(A)^T).
  const float one = 1.f, zero = 0.f;
  auto ref = [&] {
    CUBLAS_CHECK(cublasGemmEx(blas, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &one,
                              b.get(), CUDA_R_16BF, int(p.ldb), a.get(), CUDA_R_16BF, int(p.lda),
                              &zero, c_ref.get(), CUDA_R_16BF, int(p.ldc), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  };
  r.ref_ms = time_it(ref, stream, o.warmup, o.iters).median_ms;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  r.diff = rel_diff(c.get(), c_ref.get(), c_elems);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  cudaDeviceProp prop;
  cudaStream_t stream = open_device0(prop);
  std::printf(
      "bench_gemm: %s, %d SMs, bf16 in / fp32 accumulate / bf16 out, FLOP = 2mnk, "
      "median of %d after %d warm-up (CUDA events)\n",
      prop.name, prop.multiProcessorCount, o.iters, o.warmup);
  cublasHandle_t blas;
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetStream(blas, stream));
  DeviceBuffer ws(cuda::kGemmWorkspaceBytes), ws_ref(cuda::kGemmWorkspaceBytes);
  CUBLAS_CHECK(cublasSetWorkspace(blas, ws_ref.get(), ws_ref.bytes()));

  std::vector<Row> rows;
  for (const Shape3& s : shapes(o.tokens))
    if (o.only.empty() || s.name.find(o.only) != std::string::npos || s.name == "square 8192")
      rows.push_back(measure(s, o, stream, blas, ws));
  double ceiling = 0;  // best rate at 8192³ in this run
  for (const Row& r : rows)
    if (r.s.name == "square 8192")
      ceiling = tflops(2.0 * r.s.m * r.s.n * r.s.k, std::min(r.lt_ms, r.ref_ms));

  std::printf("ceilings: datasheet %.1f TFLOP/s; measured cuBLAS 8192^3 %.1f TFLOP/s\n\n",
              kPeakBf16TFlops, ceiling);
  std::printf("%-26s %6s %6s %6s %3s | %9s %8s %6s %6s | %9s %8s | %8s | %s\n", "shape", "m", "n",
              "k", "op", "lt ms", "TFLOP/s", "%peak", "%meas", "gemmex ms", "TFLOP/s", "lt-vs-ex",
              "cuBLASLt algorithm");
  for (const Row& r : rows) {
    const double flop = 2.0 * r.s.m * r.s.n * r.s.k;
    const double lt = tflops(flop, r.lt_ms), ref = tflops(flop, r.ref_ms);
    std::printf(
        "%-26s %6lld %6lld %6lld %s%s  | %9.3f %8.1f %5.1f%% %5.1f%% | %9.3f %8.1f | %8.1e | %s\n",
        r.s.name.c_str(), (long long)r.s.m, (long long)r.s.n, (long long)r.s.k, r.s.ta ? "T" : "N",
        r.s.tb ? "T" : "N", r.lt_ms, lt, 100 * lt / kPeakBf16TFlops,
        ceiling > 0 ? 100 * lt / ceiling : 0.0, r.ref_ms, ref, r.diff, r.algo.c_str());
  }
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  return 1;
}
