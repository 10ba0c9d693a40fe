// bench_attention_cudnn: meshtrain's bf16 flash kernels (the mma.sync forward and backward, and
// the Hopper TMA/wgmma forward and backward, every variant) against cuDNN's fused SDPA (backend
// API plans, ops/cuda/cudnn_attention) in one invocation. First correctness on small odd shapes
// (each output against a float64 CPU reference and against meshtrain's kernels, outputs
// NaN-poisoned before every run, fresh random inputs), then timings at B 4, S 4096, H 16, causal,
// bf16, for (Dqk, Dv) = (192, 128) and (128, 128): median of --iters after --warmup, CUDA events.
//
// FLOPs (stated in the table): causal counts half of S² ("causal = ½"): forward
// 2·B·H·S²·(Dqk + Dv) / 2, backward 2.5 × forward.
//
//   build/bench/kernels/bench_attention_cudnn [--iters 30] [--warmup 5] [--seed N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/ops/cuda/attention_kernels.h"
#include "meshtrain/ops/cuda/cudnn_attention.h"

using namespace meshtrain;
using namespace meshtrain::bench;

namespace {

struct Options {
  int iters = 30, warmup = 5;
  uint64_t seed = 0;  // 0: fresh
};

// ---- host data and the float64 reference --------------------------------------------------------

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = BFloat16::from_float(float(u(rng)));
  return v;
}
double f(uint16_t b) { return double(BFloat16::to_float(b)); }

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

// Straight from the definition, in float64: P = softmax(scale·QKᵀ) (causal: key j <= query i),
// O = PV, D = rowsum(dO∘O), dS = P∘(dO Vᵀ − D), dQ = scale·dS K, dK = scale·dSᵀ Q, dV = Pᵀ dO.
Ref reference(const cuda::AttnShape& s, const std::vector<uint16_t>& q,
              const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
              const std::vector<uint16_t>& dout) {
  const int64_t S = s.seq, H = s.heads_q, Dq = s.dim_qk, Dv = s.dim_v;
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t d) {
    return ((b * S + t) * H + h) * Dq + d;
  };
  auto vi = [&](int64_t b, int64_t t, int64_t h, int64_t d) {
    return ((b * S + t) * H + h) * Dv + d;
  };
  Ref r;
  r.out.assign(size_t(s.batch * S * H * Dv), 0);
  r.dv.assign(r.out.size(), 0);
  r.lse.assign(size_t(s.batch * H * S), 0);
  r.dq.assign(size_t(s.batch * S * H * Dq), 0);
  r.dk.assign(r.dq.size(), 0);
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = s.causal ? i + 1 : S;
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < Dq; ++d)
            acc += f(q[size_t(qi(b, i, h, d))]) * f(k[size_t(qi(b, j, h, d))]);
          p[size_t(j)] = acc * s.scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        r.lse[size_t((b * H + h) * S + i)] = mx + std::log(sum);
        for (int64_t j = 0; j < n; ++j) p[size_t(j)] /= sum;
        double delta = 0;
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += p[size_t(j)] * f(v[size_t(vi(b, j, h, d))]);
          r.out[size_t(vi(b, i, h, d))] = o;
          delta += o * f(dout[size_t(vi(b, i, h, d))]);
        }
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            const double g = f(dout[size_t(vi(b, i, h, d))]);
            acc += g * f(v[size_t(vi(b, j, h, d))]);
            r.dv[size_t(vi(b, j, h, d))] += p[size_t(j)] * g;
          }
          const double ds = p[size_t(j)] * (acc - delta) * s.scale;
          for (int64_t d = 0; d < Dq; ++d) {
            r.dq[size_t(qi(b, i, h, d))] += ds * f(k[size_t(qi(b, j, h, d))]);
            r.dk[size_t(qi(b, j, h, d))] += ds * f(q[size_t(qi(b, i, h, d))]);
          }
        }
      }
  return r;
}

// ‖got − ref‖ / ‖ref‖ (NaN if any element of got is NaN).
double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return NAN;
    d2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    r2 += ref[i] * ref[i];
  }
  return std::sqrt(d2) / std::max(std::sqrt(r2), 1e-300);
}
double max_abs_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(got[i] - ref[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

// ---- device buffers -----------------------------------------------------------------------------

void upload(DeviceBuffer& d, const std::vector<uint16_t>& h) {
  CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}
std::vector<double> download_bf16(const DeviceBuffer& d) {
  std::vector<uint16_t> h(d.bytes() / 2);
  CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  std::vector<double> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = f(h[i]);
  return out;
}
std::vector<double> download_f32(const DeviceBuffer& d) {
  std::vector<float> h(d.bytes() / 4);
  CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return std::vector<double>(h.begin(), h.end());
}
std::vector<uint8_t> raw(const DeviceBuffer& d) {
  std::vector<uint8_t> h(d.bytes());
  CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}
// Two bf16 [B, S, H, D] tensors that should be bitwise equal: how many elements differ, the
// largest |Δ| and the index of the first.
void print_bf16_diff(const char* name, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                     int64_t heads, int64_t d, int64_t seq) {
  const size_t n = a.size() / 2;
  size_t count = 0, first = n, nans = 0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t x, y;
    std::memcpy(&x, &a[2 * i], 2);
    std::memcpy(&y, &b[2 * i], 2);
    if (x == y) continue;
    if (count++ == 0) first = i;
    const uint32_t xf = uint32_t(x) << 16, yf = uint32_t(y) << 16;
    float fx, fy;
    std::memcpy(&fx, &xf, 4);
    std::memcpy(&fy, &yf, 4);
    if (std::isnan(fx) || std::isnan(fy))
      ++nans;  // a NaN's |d| would not register in the maximum
    else
      worst = std::max(worst, std::abs(double(fx) - double(fy)));
  }
  if (count == 0) return;
  const int64_t f = int64_t(first);
  std::printf(
      "      %s: %zu of %zu differ (%zu with a NaN on one side), max finite |d| %.3e, first at "
      "[b %lld, s %lld, h %lld, d %lld]\n",
      name, count, n, nans, worst, (long long)(f / (d * heads * seq)),
      (long long)(f / (d * heads) % seq), (long long)(f / d % heads), (long long)(f % d));
}

// 0xFF bytes: NaN in bf16 and fp32, so an element a kernel never writes shows. cudaMemset runs on
// the legacy default stream, which the bench's non-blocking stream does not wait for: without the
// device sync a memset can land after the next kernel began (it once NaN-ed the delta workspace of
// a repeat run, which then looked like a non-repeatable backward).
void poison(std::initializer_list<DeviceBuffer*> bufs) {
  for (DeviceBuffer* b : bufs) CUDA_CHECK(cudaMemset(b->get(), 0xFF, b->bytes()));
  CUDA_CHECK(cudaDeviceSynchronize());
}

// Everything one problem needs on the device: inputs, and outputs of one implementation.
struct Problem {
  cuda::AttnShape s;
  size_t nq, no, nl;
  DeviceBuffer q, k, v, dout, out, lse, dq, dk, dv, delta, ws90;
  explicit Problem(const cuda::AttnShape& sh)
      : s(sh),
        nq(size_t(sh.batch * sh.seq * sh.heads_q * sh.dim_qk)),
        no(size_t(sh.batch * sh.seq * sh.heads_q * sh.dim_v)),
        nl(size_t(sh.batch * sh.heads_q * sh.seq)),
        q(nq * 2),
        k(nq * 2),
        v(no * 2),
        dout(no * 2),
        out(no * 2),
        lse(nl * 4),
        dq(nq * 2),
        dk(nq * 2),
        dv(no * 2),
        delta(nl * 4),
        ws90(sm90_bwd_workspace(sh)) {}
  // The Hopper backward's workspace: delta, plus the fp32 dQ accumulator of the atomic variant.
  static size_t sm90_bwd_workspace(const cuda::AttnShape& sh) {
    size_t b = 256;
    for (int v = 0; v < cuda::attention_bwd_bf16_sm90_num_variants(sh.dim_qk, sh.dim_v); ++v)
      b = std::max(b, cuda::attention_bwd_bf16_sm90_workspace_bytes(sh, v));
    return b;
  }
  void meshtrain_fwd(cudaStream_t st) {
    if (!cuda::attention_fwd_bf16(s, q.get(), k.get(), v.get(), out.get(),
                                  static_cast<float*>(lse.get()), st))
      throw std::runtime_error("meshtrain has no bf16 forward kernel for these head dims");
  }
  // The Hopper forward; throws when it refuses (not an sm_90 device, or head dims it lacks).
  void sm90_fwd(cudaStream_t st, int variant) {
    if (!cuda::attention_fwd_bf16_sm90(s, q.get(), k.get(), v.get(), out.get(),
                                       static_cast<float*>(lse.get()), st, variant))
      throw std::runtime_error("the sm90 forward refused this shape or device");
  }
  void meshtrain_bwd(cudaStream_t st) {
    cuda::attention_bwd_bf16(s, q.get(), k.get(), v.get(), out.get(),
                             static_cast<const float*>(lse.get()), dout.get(), dq.get(), dk.get(),
                             dv.get(), static_cast<float*>(delta.get()), st);
  }
  void sm90_bwd(cudaStream_t st, int variant) {
    if (!cuda::attention_bwd_bf16_sm90(
            s, q.get(), k.get(), v.get(), out.get(), static_cast<const float*>(lse.get()),
            dout.get(), dq.get(), dk.get(), dv.get(), static_cast<float*>(ws90.get()), st, variant))
      throw std::runtime_error("the sm90 backward refused this shape or device");
  }
  void cudnn_fwd(DeviceBuffer& ws, cudaStream_t st) {
    cuda::cudnn_attention_fwd(s, q.get(), k.get(), v.get(), out.get(),
                              static_cast<float*>(lse.get()), ws.get(), ws.bytes(), st);
  }
  void cudnn_bwd(DeviceBuffer& ws, cudaStream_t st, cuda::CudnnBwdMode mode) {
    cuda::cudnn_attention_bwd(s, q.get(), k.get(), v.get(), out.get(),
                              static_cast<const float*>(lse.get()), dout.get(), dq.get(), dk.get(),
                              dv.get(), ws.get(), ws.bytes(), st, mode);
  }
};

struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};
Outputs read(const Problem& p) {
  return {download_bf16(p.out), download_f32(p.lse), download_bf16(p.dq), download_bf16(p.dk),
          download_bf16(p.dv)};
}

void print_errors(const char* who, const char* against, const Outputs& o, const Outputs& ref) {
  std::printf("    %-22s vs %-10s rel out %.2e  dq %.2e  dk %.2e  dv %.2e  max|Δlse| %.2e\n", who,
              against, rel_err(o.out, ref.out), rel_err(o.dq, ref.dq), rel_err(o.dk, ref.dk),
              rel_err(o.dv, ref.dv), max_abs_err(o.lse, ref.lse));
}

size_t workspace_for(const cuda::AttnShape& s) {
  size_t ws = cuda::cudnn_attention_fwd_plan(s).workspace;
  for (auto mode : {cuda::CudnnBwdMode::kDeterministic, cuda::CudnnBwdMode::kAtomic})
    ws = std::max(ws, cuda::cudnn_attention_bwd_plan(s, mode).workspace);
  return std::max<size_t>(ws, 256);
}

void print_plans(const cuda::AttnShape& s) {
  auto line = [](const char* what, const cuda::CudnnAttnPlanInfo& i) {
    std::printf("    plan %-22s engine %lld%s, cuDNN workspace %.1f MiB, total %.1f MiB\n", what,
                (long long)i.engine, i.nondeterministic ? " (NONDETERMINISTIC note)" : "",
                double(i.plan_workspace) / 1048576.0, double(i.workspace) / 1048576.0);
  };
  line("forward", cuda::cudnn_attention_fwd_plan(s));
  line("backward deterministic",
       cuda::cudnn_attention_bwd_plan(s, cuda::CudnnBwdMode::kDeterministic));
  line("backward atomic dQ", cuda::cudnn_attention_bwd_plan(s, cuda::CudnnBwdMode::kAtomic));
}

// ---- correctness --------------------------------------------------------------------------------

// Returns false if any cuDNN output is off by more than bf16 tolerance (2e-2), an sm90 forward
// output by more than 1e-2 (lse 1e-4), or any is NaN.
bool check_small(const cuda::AttnShape& s, uint64_t seed, cudaStream_t st) {
  std::printf("\n  B=%lld S=%lld H=%lld Dqk=%lld Dv=%lld %s (seed %llu)\n", (long long)s.batch,
              (long long)s.seq, (long long)s.heads_q, (long long)s.dim_qk, (long long)s.dim_v,
              s.causal ? "causal" : "non-causal", (unsigned long long)seed);
  Problem p(s);
  std::mt19937_64 rng(seed);
  auto hq = random_bf16(p.nq, rng, -2, 2), hk = random_bf16(p.nq, rng, -2, 2);
  auto hv = random_bf16(p.no, rng, -1, 1), hdo = random_bf16(p.no, rng, -1, 1);
  upload(p.q, hq);
  upload(p.k, hk);
  upload(p.v, hv);
  upload(p.dout, hdo);
  const auto t0 = std::chrono::steady_clock::now();
  Ref r = reference(s, hq, hk, hv, hdo);
  std::printf("    float64 CPU reference: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const Outputs ref{r.out, r.lse, r.dq, r.dk, r.dv};

  poison({&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.delta});
  p.meshtrain_fwd(st);
  p.meshtrain_bwd(st);
  CUDA_CHECK(cudaStreamSynchronize(st));
  const Outputs mt = read(p);
  print_errors("meshtrain kernels", "float64", mt, ref);
  bool ok = true;
  for (int var = 0; var < cuda::attention_fwd_bf16_sm90_num_variants(s.dim_qk, s.dim_v); ++var) {
    poison({&p.out, &p.lse});
    p.sm90_fwd(st, var);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<double> o = download_bf16(p.out), l = download_f32(p.lse);
    const double e_out = rel_err(o, ref.out), e_lse = max_abs_err(l, ref.lse);
    std::printf(
        "    sm90 fwd %-26s vs float64    rel out %.2e  max|Δlse| %.2e  (vs mma.sync out "
        "%.2e)\n",
        cuda::attention_fwd_bf16_sm90_variant_name(s.dim_qk, s.dim_v, var), e_out, e_lse,
        rel_err(o, mt.out));
    ok = ok && e_out <= 1e-2 && e_lse <= 1e-4;
  }
  // The Hopper backward from the sm90 forward's out and lse; the deterministic ones must repeat
  // bitwise.
  for (int var = 0; var < cuda::attention_bwd_bf16_sm90_num_variants(s.dim_qk, s.dim_v); ++var) {
    poison({&p.dq, &p.dk, &p.dv, &p.ws90});
    p.sm90_bwd(st, var);
    CUDA_CHECK(cudaStreamSynchronize(st));
    Outputs o = read(p);
    o.out = ref.out;  // not this pass's output
    o.lse = ref.lse;
    const std::string who = std::string("sm90 bwd ") +
                            cuda::attention_bwd_bf16_sm90_variant_name(s.dim_qk, s.dim_v, var);
    print_errors(who.c_str(), "float64", o, ref);
    for (double e : {rel_err(o.dq, ref.dq), rel_err(o.dk, ref.dk), rel_err(o.dv, ref.dv)})
      ok = ok && e <= 1e-2;
    if (cuda::attention_bwd_bf16_sm90_variant_deterministic(s.dim_qk, s.dim_v, var)) {
      const auto dq0 = raw(p.dq), dk0 = raw(p.dk), dv0 = raw(p.dv);
      poison({&p.dq, &p.dk, &p.dv, &p.ws90});
      p.sm90_bwd(st, var);
      CUDA_CHECK(cudaStreamSynchronize(st));
      const bool same = raw(p.dq) == dq0 && raw(p.dk) == dk0 && raw(p.dv) == dv0;
      std::printf("    %s run twice: %s\n", who.c_str(),
                  same ? "bitwise equal" : "DIFFERS bitwise");
      ok = ok && same;
    }
  }

  print_plans(s);
  DeviceBuffer ws(workspace_for(s));
  for (auto mode : {cuda::CudnnBwdMode::kDeterministic, cuda::CudnnBwdMode::kAtomic}) {
    const bool det = mode == cuda::CudnnBwdMode::kDeterministic;
    poison({&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &ws});
    p.cudnn_fwd(ws, st);
    p.cudnn_bwd(ws, st, mode);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const Outputs cd = read(p);
    const char* who = det ? "cuDNN (deterministic)" : "cuDNN (atomic dQ)";
    print_errors(who, "float64", cd, ref);
    print_errors(who, "meshtrain", cd, mt);
    for (double e : {rel_err(cd.out, ref.out), rel_err(cd.dq, ref.dq), rel_err(cd.dk, ref.dk),
                     rel_err(cd.dv, ref.dv)})
      ok = ok && e <= 2e-2;
    ok = ok && max_abs_err(cd.lse, ref.lse) <= 1e-3;
    // Repeatability: the same backward again, bitwise.
    const auto dq0 = raw(p.dq), dk0 = raw(p.dk), dv0 = raw(p.dv);
    poison({&p.dq, &p.dk, &p.dv});
    p.cudnn_bwd(ws, st, mode);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const bool same = raw(p.dq) == dq0 && raw(p.dk) == dk0 && raw(p.dv) == dv0;
    std::printf("    %-22s backward run twice: %s\n", who,
                same ? "bitwise equal" : "DIFFERS bitwise");
    if (det && !same) ok = false;
  }
  return ok;
}

// ---- timings ------------------------------------------------------------------------------------

void time_config(const Options& o, int64_t dqk, int64_t dv, cudaStream_t st) {
  const cuda::AttnShape s{4, 4096, 16, 16, dqk, dv, 1.0 / std::sqrt(double(dqk)), true};
  Problem p(s);
  fill_random_bf16(p.q.get(), p.nq, 1, 2.f, st);
  fill_random_bf16(p.k.get(), p.nq, 2, 2.f, st);
  fill_random_bf16(p.v.get(), p.no, 3, 1.f, st);
  fill_random_bf16(p.dout.get(), p.no, 4, 1.f, st);
  const double s2 = double(s.batch * s.heads_q) * double(s.seq) * double(s.seq);
  const double f_fwd = 2 * s2 * double(dqk + dv) / 2, f_bwd = 2.5 * f_fwd;
  std::printf("\n  B=4 S=4096 H=16 Dqk=%lld Dv=%lld causal bf16\n", (long long)dqk, (long long)dv);
  print_plans(s);
  DeviceBuffer ws(workspace_for(s));
  auto row = [&](const char* impl, const char* pass, double flop, const std::function<void()>& fn) {
    const Timing t = time_it(fn, st, o.warmup, o.iters);
    std::printf("  | %-3lld/%-3lld | %-28s | %-8s | %8.3f | %7.1f | (min %.3f max %.3f)\n",
                (long long)dqk, (long long)dv, impl, pass, t.median_ms, tflops(flop, t.median_ms),
                t.min_ms, t.max_ms);
    return t.median_ms;
  };
  std::printf("  | dqk/dv  | implementation               | pass     |   ms     | TFLOP/s |\n");
  for (int var = 0; var < cuda::attention_fwd_bf16_sm90_num_variants(dqk, dv); ++var) {
    const std::string name =
        std::string("sm90 ") + cuda::attention_fwd_bf16_sm90_variant_name(dqk, dv, var);
    row(name.c_str(), "forward", f_fwd, [&] { p.sm90_fwd(st, var); });
  }
  row("meshtrain (mma.sync)", "forward", f_fwd, [&] { p.meshtrain_fwd(st); });
  row("meshtrain (mma.sync)", "backward", f_bwd, [&] { p.meshtrain_bwd(st); });
  CUDA_CHECK(cudaStreamSynchronize(st));
  const Outputs mt = read(p);
  for (int var = 0; var < cuda::attention_bwd_bf16_sm90_num_variants(dqk, dv); ++var) {
    const std::string name =
        std::string("sm90 ") + cuda::attention_bwd_bf16_sm90_variant_name(dqk, dv, var);
    row(name.c_str(), "backward", f_bwd, [&] { p.sm90_bwd(st, var); });
    CUDA_CHECK(cudaStreamSynchronize(st));
    Outputs o = read(p);
    o.out = mt.out;
    o.lse = mt.lse;
    print_errors(("full size: " + name).c_str(), "mma.sync", o, mt);
  }
  // Repeatability of every deterministic sm90 backward at full size.
  for (int var = 0; var < cuda::attention_bwd_bf16_sm90_num_variants(dqk, dv); ++var) {
    if (!cuda::attention_bwd_bf16_sm90_variant_deterministic(dqk, dv, var)) continue;
    p.sm90_bwd(st, var);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const auto dq0 = raw(p.dq), dk0 = raw(p.dk), dv0 = raw(p.dv);
    int equal = 0;
    for (int r = 0; r < 5; ++r) {
      poison({&p.dq, &p.dk, &p.dv, &p.ws90});
      p.sm90_bwd(st, var);
      CUDA_CHECK(cudaStreamSynchronize(st));
      const auto dq1 = raw(p.dq), dk1 = raw(p.dk), dv1 = raw(p.dv);
      const bool same = dq1 == dq0 && dk1 == dk0 && dv1 == dv0;
      equal += same;
      if (!same) {  // where the repeat differs: [B, S, H, D] of the first element, count, max |Δ|
        print_bf16_diff("dq", dq0, dq1, s.heads_q, s.dim_qk, s.seq);
        print_bf16_diff("dk", dk0, dk1, s.heads_kv, s.dim_qk, s.seq);
        print_bf16_diff("dv", dv0, dv1, s.heads_kv, s.dim_v, s.seq);
      }
    }
    std::printf("    full size: sm90 %s: %d of 5 repeats bitwise equal\n",
                cuda::attention_bwd_bf16_sm90_variant_name(dqk, dv, var), equal);
  }
  poison({&p.out, &p.lse});
  p.sm90_fwd(st, 0);
  CUDA_CHECK(cudaStreamSynchronize(st));
  std::printf("    full size: sm90 forward vs mma.sync: rel out %.2e  max|Δlse| %.2e\n",
              rel_err(download_bf16(p.out), mt.out), max_abs_err(download_f32(p.lse), mt.lse));
  poison({&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &ws});
  row("cuDNN fused SDPA", "forward", f_fwd, [&] { p.cudnn_fwd(ws, st); });
  row("cuDNN deterministic", "backward", f_bwd,
      [&] { p.cudnn_bwd(ws, st, cuda::CudnnBwdMode::kDeterministic); });
  CUDA_CHECK(cudaStreamSynchronize(st));
  const Outputs cd = read(p);
  row("cuDNN atomic dQ", "backward", f_bwd,
      [&] { p.cudnn_bwd(ws, st, cuda::CudnnBwdMode::kAtomic); });
  CUDA_CHECK(cudaStreamSynchronize(st));
  print_errors("full size: cuDNN (det.)", "meshtrain", cd, mt);
  // Forward then backward, as a training step runs them (FLOPs 3.5 × forward).
  row("meshtrain (mma.sync)", "fwd+bwd", f_fwd + f_bwd, [&] {
    p.meshtrain_fwd(st);
    p.meshtrain_bwd(st);
  });
  row("meshtrain (sm90 fwd)", "fwd+bwd", f_fwd + f_bwd, [&] {
    p.sm90_fwd(st, 0);
    p.meshtrain_bwd(st);
  });
  row("meshtrain (sm90 fwd+bwd)", "fwd+bwd", f_fwd + f_bwd, [&] {
    p.sm90_fwd(st, 0);
    p.sm90_bwd(st, 0);
  });
  row("cuDNN deterministic", "fwd+bwd", f_fwd + f_bwd, [&] {
    p.cudnn_fwd(ws, st);
    p.cudnn_bwd(ws, st, cuda::CudnnBwdMode::kDeterministic);
  });
  // Repeatability at full size: the backward again from the same inputs, bitwise.
  for (auto mode : {cuda::CudnnBwdMode::kDeterministic, cuda::CudnnBwdMode::kAtomic}) {
    p.cudnn_bwd(ws, st, mode);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const auto dq0 = raw(p.dq), dk0 = raw(p.dk), dv0 = raw(p.dv);
    int equal = 0;
    const int repeats = 5;
    for (int r = 0; r < repeats; ++r) {
      poison({&p.dq, &p.dk, &p.dv});
      p.cudnn_bwd(ws, st, mode);
      CUDA_CHECK(cudaStreamSynchronize(st));
      equal += raw(p.dq) == dq0 && raw(p.dk) == dk0 && raw(p.dv) == dv0;
    }
    std::printf("    full size: cuDNN %s backward: %d of %d repeats bitwise equal\n",
                mode == cuda::CudnnBwdMode::kDeterministic ? "deterministic" : "atomic dQ", equal,
                repeats);
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: bench_attention_cudnn [--iters N] [--warmup N] [--seed N]\n");
      std::exit(2);
    }
    const long long v = std::atoll(argv[++i]);
    if (a == "--iters")
      o.iters = int(std::max(1LL, v));
    else if (a == "--warmup")
      o.warmup = int(std::max(0LL, v));
    else if (a == "--seed")
      o.seed = uint64_t(v);
    else {
      std::fprintf(stderr, "bench_attention_cudnn: unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.seed == 0) o.seed = std::random_device{}() | 1;
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  cudaDeviceProp prop;
  cudaStream_t st = open_device0(prop);
  std::printf("bench_attention_cudnn: %s, %d SMs, cuDNN %lld (loaded)\n", prop.name,
              prop.multiProcessorCount, (long long)cuda::cudnn_attention_version());
  std::printf("correctness: rel = ‖out−ref‖/‖ref‖; outputs NaN-poisoned before every run\n");
  bool ok = true;
  for (auto [b, sq, h, dqk, dv] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{3, 333, 5, 192, 128},
        {3, 333, 5, 128, 128},
        {1, 1000, 3, 192, 128}}) {
    const cuda::AttnShape s{b, sq, h, h, dqk, dv, 1.0 / std::sqrt(double(dqk)), true};
    try {
      ok = check_small(s, o.seed + uint64_t(sq + dqk), st) && ok;
    } catch (const std::exception& e) {
      std::printf("    FAILED: %s\n", e.what());
      ok = false;
    }
  }
  std::printf(
      "\ntimings: median of %d after %d warm-up (CUDA events); TFLOP/s with causal = ½ "
      "S²: forward 2·B·H·S²·(Dqk+Dv)/2, backward 2.5 × forward\n",
      o.iters, o.warmup);
  for (auto [dqk, dv] : {std::pair<int64_t, int64_t>{192, 128}, {128, 128}}) {
    try {
      time_config(o, dqk, dv, st);
    } catch (const std::exception& e) {
      std::printf("    FAILED (%lld/%lld): %s\n", (long long)dqk, (long long)dv, e.what());
      ok = false;
    }
  }
  std::printf("\nbench_attention_cudnn: %s\n",
              ok ? "all cuDNN and sm90 checks passed" : "SOME CHECKS FAILED");
  cudaStreamDestroy(st);
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attention_cudnn: %s\n", e.what());
  return 1;
}
