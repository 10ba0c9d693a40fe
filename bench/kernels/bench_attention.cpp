// bench_attention: the bf16 flash-attention kernels at B=4, S=4096, H=16 (qk 192 / v 128, the
// DeepSeek MLA shape, and 128/128), causal and not: every forward tile variant (mma.sync, then the
// Hopper TMA/wgmma kernel's, "fwd sm90"), the backward (total and per pass; then "bwd sm90",
// the Hopper backward's variants) and forward+backward.
// Median of --iters after --warmup, CUDA events, random bf16 inputs.
//
// FLOP conventions (say which one a number uses when you quote it):
//   forward       2·B·H·S²·(Dqk + Dv)          (QKᵀ and PV)
//   backward      2·B·H·S²·(3·Dqk + 2·Dv)      (FA2's five products: QKᵀ, dO·Vᵀ, Pᵀ·dO, dS·K,
//   dSᵀ·Q) causal        half of the above: only the visible triangle counts ("causal = ½"), as the
//                 flash-attention benchmarks count it; the "full S²" column doubles it, the
//                 convention of benchmarks that ignore the mask.
// The backward here executes 2·B·H·S²·(4·Dqk + 3·Dv) (dQ recomputes QKᵀ and dO·Vᵀ, see
// attention_bwd_dq.cu); "exec" columns count that work, "nominal" ones the five products.
// Ceilings: the 989.5 TFLOP/s datasheet bf16 peak and cuBLAS bf16 8192³ measured in this run.
//
//   build-cuda/bench/kernels/bench_attention [--batch 4] [--seq 4096] [--heads 16]
//                                            [--kv-heads 16] [--iters 20] [--warmup 5]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/cublaslt_matmul.h"

using namespace meshtrain;
using namespace meshtrain::bench;

namespace {

struct Options {
  int64_t batch = 4, seq = 4096, heads = 16, kv_heads = 16;
  int iters = 20, warmup = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_attention: %s expects a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--batch")
      o.batch = value();
    else if (a == "--seq")
      o.seq = value();
    else if (a == "--heads")
      o.heads = value();
    else if (a == "--kv-heads")
      o.kv_heads = value();
    else if (a == "--iters")
      o.iters = int(std::max<int64_t>(1, value()));
    else if (a == "--warmup")
      o.warmup = int(std::max<int64_t>(0, value()));
    else {
      std::fprintf(stderr,
                   "usage: bench_attention [--batch N] [--seq N] [--heads N] "
                   "[--kv-heads N] [--iters N] [--warmup N]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

double measure_gemm_ceiling(const Options& o, cudaStream_t stream) {
  const int64_t n = 8192;
  DeviceBuffer a(size_t(n * n) * 2), b(size_t(n * n) * 2), c(size_t(n * n) * 2);
  DeviceBuffer ws(cuda::kGemmWorkspaceBytes);
  fill_random_bf16(a.get(), size_t(n * n), 11, 1.f, stream);
  fill_random_bf16(b.get(), size_t(n * n), 12, 1.f, stream);
  auto plan = cuda::gemm_plan(0, cuda::gemm_problem(DType::kBF16, false, false, n, n, n),
                              cuda::kGemmWorkspaceBytes);
  const Timing t =
      time_it([&] { plan->run(a.get(), b.get(), c.get(), ws.get(), ws.bytes(), stream); }, stream,
              o.warmup, o.iters);
  return tflops(2.0 * n * n * n, t.median_ms);
}

// Max |x - y| over two bf16 device buffers (variant agreement on the full-size problem).
double max_abs_diff(const void* x, const void* y, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  CUDA_CHECK(cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), y, n * 2, cudaMemcpyDeviceToHost));
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::abs(double(BFloat16::to_float(a[i])) - BFloat16::to_float(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as the max
  }
  return m;
}

struct Config {
  int64_t dqk, dv;
  bool causal;
};

void print_row(const char* what, const char* variant, double ms, double flop_nominal,
               double flop_exec, double causal_factor, double ceiling, const std::string& note) {
  const double tf = tflops(flop_nominal, ms), tf_exec = tflops(flop_exec, ms);
  std::printf(
      "  %-10s %-24s %9.3f ms  %7.1f TF/s  full-S² %7.1f  exec %7.1f  %5.1f%% peak  "
      "%5.1f%% cuBLAS  %s\n",
      what, variant, ms, tf, tf / causal_factor, tf_exec, 100 * tf / kPeakBf16TFlops,
      ceiling > 0 ? 100 * tf / ceiling : 0.0, note.c_str());
}

void run_config(const Options& o, const Config& c, double ceiling, cudaStream_t stream) {
  cuda::AttnShape s{
      o.batch, o.seq, o.heads, o.kv_heads, c.dqk, c.dv, 1.0 / std::sqrt(double(c.dqk)), c.causal};
  const size_t nq = size_t(s.batch * s.seq * s.heads_q * s.dim_qk);
  const size_t nk = size_t(s.batch * s.seq * s.heads_kv * s.dim_qk);
  const size_t nv = size_t(s.batch * s.seq * s.heads_kv * s.dim_v);
  const size_t no = size_t(s.batch * s.seq * s.heads_q * s.dim_v);
  const size_t nl = size_t(s.batch * s.heads_q * s.seq);
  DeviceBuffer q(nq * 2), k(nk * 2), v(nv * 2), out(no * 2), out0(no * 2), lse(nl * 4);
  DeviceBuffer dout(no * 2), dq(nq * 2), dk(nk * 2), dv(nv * 2), delta(nl * 4);
  fill_random_bf16(q.get(), nq, 1, 2.f, stream);
  fill_random_bf16(k.get(), nk, 2, 2.f, stream);
  fill_random_bf16(v.get(), nv, 3, 1.f, stream);
  fill_random_bf16(dout.get(), no, 4, 1.f, stream);

  const double cf = c.causal ? 0.5 : 1.0;
  const double s2 = double(s.batch) * double(s.heads_q) * double(s.seq) * double(s.seq);
  const double f_fwd = 2 * s2 * double(c.dqk + c.dv) * cf;
  const double f_bwd = 2 * s2 * double(3 * c.dqk + 2 * c.dv) * cf;
  const double f_bwd_exec = 2 * s2 * double(4 * c.dqk + 3 * c.dv) * cf;
  std::printf("\nB=%lld S=%lld Hq=%lld Hkv=%lld Dqk=%lld Dv=%lld %s\n", (long long)s.batch,
              (long long)s.seq, (long long)s.heads_q, (long long)s.heads_kv, (long long)s.dim_qk,
              (long long)s.dim_v, c.causal ? "causal" : "non-causal");

  auto* lsep = static_cast<float*>(lse.get());
  auto* deltap = static_cast<float*>(delta.get());
  const int variants = cuda::attention_fwd_bf16_num_variants(c.dqk, c.dv);
  for (int var = 0; var < variants; ++var) {
    void* dst = var == 0 ? out0.get() : out.get();
    auto fwd = [&] {
      if (!cuda::attention_fwd_bf16(s, q.get(), k.get(), v.get(), dst, lsep, stream, var))
        throw std::runtime_error("no forward kernel for these head dims");
    };
    const Timing t = time_it(fwd, stream, o.warmup, o.iters);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    char note[96];
    if (var == 0)
      std::snprintf(note, sizeof(note), "(default)");
    else
      std::snprintf(note, sizeof(note), "max|Δ| vs default %.2e",
                    max_abs_diff(out.get(), out0.get(), no));
    print_row("forward", cuda::attention_fwd_bf16_variant_name(c.dqk, c.dv, var), t.median_ms,
              f_fwd, f_fwd, cf, ceiling, note);
  }
  // The Hopper forward (TMA, wgmma): every variant, compared with the mma.sync default's output.
  const int sm90_variants = cuda::attention_fwd_bf16_sm90_num_variants(c.dqk, c.dv);
  for (int var = 0; var < sm90_variants; ++var) {
    auto fwd = [&] {
      if (!cuda::attention_fwd_bf16_sm90(s, q.get(), k.get(), v.get(), out.get(), lsep, stream,
                                         var))
        throw std::runtime_error("the sm90 forward refused this shape or device");
    };
    const Timing t = time_it(fwd, stream, o.warmup, o.iters);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    char note[96];
    std::snprintf(note, sizeof(note), "max|Δ| vs mma.sync default %.2e",
                  max_abs_diff(out.get(), out0.get(), no));
    print_row("fwd sm90", cuda::attention_fwd_bf16_sm90_variant_name(c.dqk, c.dv, var), t.median_ms,
              f_fwd, f_fwd, cf, ceiling, note);
  }
  // Backward from the default forward's out and lse.
  if (!cuda::attention_fwd_bf16(s, q.get(), k.get(), v.get(), out0.get(), lsep, stream))
    throw std::runtime_error("no forward kernel");
  auto bwd = [&](cuda::AttnBwdPasses passes) {
    return [&, passes] {
      cuda::attention_bwd_bf16(s, q.get(), k.get(), v.get(), out0.get(), lsep, dout.get(), dq.get(),
                               dk.get(), dv.get(), deltap, stream, passes);
    };
  };
  const Timing tb = time_it(bwd(cuda::AttnBwdPasses::kAll), stream, o.warmup, o.iters);
  print_row("backward", "delta + dK/dV + dQ", tb.median_ms, f_bwd, f_bwd_exec, cf, ceiling, "");
  const Timing td = time_it(bwd(cuda::AttnBwdPasses::kDelta), stream, o.warmup, o.iters);
  const Timing tkv = time_it(bwd(cuda::AttnBwdPasses::kDkdv), stream, o.warmup, o.iters);
  const Timing tq = time_it(bwd(cuda::AttnBwdPasses::kDq), stream, o.warmup, o.iters);
  // Per pass: dK/dV executes 2·(2 Dqk + 2 Dv), dQ 2·(2 Dqk + Dv) per score element.
  const double f_dkdv = 2 * s2 * double(2 * c.dqk + 2 * c.dv) * cf;
  const double f_dq = 2 * s2 * double(2 * c.dqk + c.dv) * cf;
  const double delta_gb = double(2 * no * 2 + nl * 4) / 1e9;
  std::printf("  %-10s %-24s %9.3f ms  %7.1f GB/s (reads out and dout once)\n", "  pass", "delta",
              td.median_ms, delta_gb / (td.median_ms * 1e-3));
  print_row("  pass", "dK/dV", tkv.median_ms, f_dkdv, f_dkdv, cf, ceiling, "(exec = its own work)");
  print_row("  pass", "dQ", tq.median_ms, f_dq, f_dq, cf, ceiling, "(exec = its own work)");
  // The Hopper backward (TMA, wgmma): every variant from the same out and lse, compared with the
  // mma.sync backward's dq / dk. The deterministic default executes the same 7 products (its dQ
  // kernel recomputes S and dP); the atomic-dQ variant the nominal 5.
  const int sm90_bwd_variants = cuda::attention_bwd_bf16_sm90_num_variants(c.dqk, c.dv);
  if (sm90_bwd_variants > 0) {
    DeviceBuffer dq0(nq * 2), dk0(nk * 2);
    bwd(cuda::AttnBwdPasses::kAll)();
    CUDA_CHECK(cudaMemcpyAsync(dq0.get(), dq.get(), nq * 2, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(dk0.get(), dk.get(), nk * 2, cudaMemcpyDeviceToDevice, stream));
    size_t ws_bytes = 256;
    for (int var = 0; var < sm90_bwd_variants; ++var)
      ws_bytes = std::max(ws_bytes, cuda::attention_bwd_bf16_sm90_workspace_bytes(s, var));
    DeviceBuffer ws(ws_bytes);
    for (int var = 0; var < sm90_bwd_variants; ++var) {
      const char* name = cuda::attention_bwd_bf16_sm90_variant_name(c.dqk, c.dv, var);
      auto bwd90 = [&] {
        if (!cuda::attention_bwd_bf16_sm90(s, q.get(), k.get(), v.get(), out0.get(), lsep,
                                           dout.get(), dq.get(), dk.get(), dv.get(),
                                           static_cast<float*>(ws.get()), stream, var))
          throw std::runtime_error("the sm90 backward refused this shape or device");
      };
      const Timing t = time_it(bwd90, stream, o.warmup, o.iters);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      char note[96];
      std::snprintf(note, sizeof(note), "max|Δ| vs mma.sync dq %.2e dk %.2e",
                    max_abs_diff(dq.get(), dq0.get(), nq), max_abs_diff(dk.get(), dk0.get(), nk));
      const bool atomic = std::string(name).find("atomic") != std::string::npos;
      print_row("bwd sm90", name, t.median_ms, f_bwd, atomic ? f_bwd : f_bwd_exec, cf, ceiling,
                note);
    }
  }
  auto fwdbwd = [&] {
    cuda::attention_fwd_bf16(s, q.get(), k.get(), v.get(), out0.get(), lsep, stream);
    bwd(cuda::AttnBwdPasses::kAll)();
  };
  const Timing tfb = time_it(fwdbwd, stream, o.warmup, o.iters);
  print_row("fwd+bwd", "default forward", tfb.median_ms, f_fwd + f_bwd, f_fwd + f_bwd_exec, cf,
            ceiling, "");
  if (sm90_variants > 0) {
    auto fwdbwd90 = [&] {
      cuda::attention_fwd_bf16_sm90(s, q.get(), k.get(), v.get(), out0.get(), lsep, stream);
      bwd(cuda::AttnBwdPasses::kAll)();
    };
    const Timing t90 = time_it(fwdbwd90, stream, o.warmup, o.iters);
    print_row("fwd+bwd", "sm90 forward", t90.median_ms, f_fwd + f_bwd, f_fwd + f_bwd_exec, cf,
              ceiling, "");
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  cudaDeviceProp prop;
  cudaStream_t stream = open_device0(prop);
  const double ceiling = measure_gemm_ceiling(o, stream);
  std::printf("bench_attention: %s, %d SMs; median of %d after %d warm-up (CUDA events)\n",
              prop.name, prop.multiProcessorCount, o.iters, o.warmup);
  std::printf("ceilings: datasheet bf16 %.1f TFLOP/s; cuBLAS bf16 8192^3 measured %.1f TFLOP/s\n",
              kPeakBf16TFlops, ceiling);
  std::printf(
      "TF/s columns: causal = ½ S² (flash-attention convention); full-S² = as if "
      "non-causal; exec = work this backward actually does (7 products, not 5)\n");
  for (const Config& c : {Config{192, 128, true}, Config{128, 128, true}, Config{192, 128, false}})
    run_config(o, c, ceiling, stream);
  cudaStreamDestroy(stream);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attention: %s\n", e.what());
  return 1;
}
