// The CPU-vs-CUDA op harness (see header).
#include "op_harness.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "cuda_test_util.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain::cudatest {

uint64_t fresh_seed() {
  if (const char* env = std::getenv("MESHTRAIN_TEST_SEED"); env && *env)
    return std::strtoull(env, nullptr, 10);
  return uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()) | 1;
}

DType reference_dtype(DType d) {
  switch (d) {
    case DType::kBF16: return DType::kF32;
    case DType::kF32: return DType::kF64;
    default: return d;
  }
}

double unit_roundoff(DType d) {
  switch (d) {
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kF32: return std::ldexp(1.0, -24);
    case DType::kF64: return std::ldexp(1.0, -53);
    default: return 0;
  }
}

void note_compared_graph(const Graph& g) {
  std::vector<std::string> ops;
  for (const Node& n : g.nodes())
    if (!n.dead) ops.push_back(n.op);
  testing::note_checked(testing::Check::kCudaVsCpu, ops);
}

Tolerance default_tolerance(DType d) {
  switch (d) {
    case DType::kF32: return {1e-5, 1e-6};
    case DType::kBF16: return {1e-2, 4e-3};
    case DType::kF64: return {1e-12, 1e-13};
    default: return {0, 0};
  }
}

namespace {

double round_to(DType d, double v) {
  switch (d) {
    case DType::kF32: return double(float(v));
    case DType::kBF16: return double(float(BFloat16(float(v))));
    case DType::kI32: return double(int32_t(v));
    case DType::kI64: return double(int64_t(v));
    case DType::kF64: return v;
  }
  return v;
}

std::vector<double> draw(const InputSpec& s, DType device_dtype, std::mt19937_64& rng) {
  const int64_t n = s.shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x;
    if (s.gen) {
      x = s.gen(rng, i);
    } else if (!is_floating(device_dtype)) {
      x = double(
          std::uniform_int_distribution<int64_t>(s.int_lo, std::max(s.int_lo, s.int_hi - 1))(rng));
    } else {
      x = std::uniform_real_distribution<double>(s.lo, s.hi)(rng);
    }
    v[size_t(i)] = round_to(device_dtype, x);
  }
  return v;
}

struct Built {
  Graph g;
  std::vector<ValueId> ins, weights, outs, grads;
};

// The case's graph in the device dtypes (device = true) or the CPU reference dtypes.
void build(const OpCase& c, bool device, Built& r) {
  Builder b(r.g);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    const DType dt = device || c.same_dtypes_on_cpu ? s.dtype : reference_dtype(s.dtype);
    r.ins.push_back(b.input(fmt::format("x{}", i), {s.shape, dt}));
  }
  r.outs = c.build(b, r.ins);
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.backward && c.inputs[i].differentiable && is_floating(c.inputs[i].dtype))
      wrt.push_back(r.ins[i]);
  r.weights.assign(r.outs.size(), kNoValue);
  r.grads.assign(c.inputs.size(), kNoValue);
  if (!wrt.empty()) {
    ValueId loss = kNoValue;
    for (size_t i = 0; i < r.outs.size(); ++i) {
      const TensorMeta m = b.meta(r.outs[i]);
      if (!is_floating(m.dtype)) continue;
      // The CPU kernels cannot multiply bf16 (a cast op's output): weigh its float32 copy.
      ValueId out = r.outs[i];
      TensorMeta wm = m;
      if (!device && m.dtype == DType::kBF16) {
        wm.dtype = DType::kF32;
        out = ops::cast(b, out, DType::kF32);
      }
      r.weights[i] = b.input(fmt::format("r{}", i), wm);
      // Terms are summed in float64 so outputs of different dtypes can share one loss.
      ValueId term = ops::cast(b, ops::sum(b, ops::mul(b, out, r.weights[i])), DType::kF64);
      loss = loss == kNoValue ? term : ops::add(b, loss, term);
    }
    if (loss != kNoValue) {
      GradientMap gm = differentiate(r.g, loss, wrt);
      for (size_t i = 0; i < c.inputs.size(); ++i) r.grads[i] = gm.grad_of(r.ins[i]);
    }
  }
  for (ValueId o : r.outs) r.g.mark_output(o);
  for (ValueId gv : r.grads)
    if (gv != kNoValue) r.g.mark_output(gv);
  eliminate_dead_nodes(r.g);
}

void write_host(const Tensor& t, const std::vector<double>& v) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = v[size_t(i)];
    switch (t.dtype()) {
      case DType::kF32: static_cast<float*>(t.raw())[i] = float(x); break;
      case DType::kF64: static_cast<double*>(t.raw())[i] = x; break;
      case DType::kBF16: static_cast<BFloat16*>(t.raw())[i] = BFloat16(float(x)); break;
      case DType::kI32: static_cast<int32_t*>(t.raw())[i] = int32_t(x); break;
      case DType::kI64: static_cast<int64_t*>(t.raw())[i] = int64_t(x); break;
    }
  }
}

std::vector<double> read_host(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.item_as_double(i);
  return v;
}

// Compares one tensor; appends a line to `report` and returns false when it fails. `mag` (the
// element's Σ|terms|, or empty) replaces the atol x max|ref| part of the bound.
bool compare(const std::string& what, const std::vector<double>& ref,
             const std::vector<double>& got, const std::vector<double>& mag, DType device_dtype,
             const Tolerance& case_tol, bool exact, std::string& report) {
  if (ref.size() != got.size()) {
    report +=
        fmt::format("  {}: {} elements on the CPU, {} on the GPU\n", what, ref.size(), got.size());
    return false;
  }
  Tolerance tol = exact ? Tolerance{0, 0} : default_tolerance(device_dtype);
  if (!exact && case_tol.rtol >= 0) tol.rtol = case_tol.rtol;
  if (!exact && case_tol.atol >= 0) tol.atol = case_tol.atol;
  const bool by_terms = !exact && case_tol.terms > 0 && mag.size() == ref.size();
  const double per_term =
      by_terms ? case_tol.terms * unit_roundoff(case_tol.terms_dtype.value_or(device_dtype)) : 0;
  double scale = 0;
  for (double r : ref)
    if (std::isfinite(r)) scale = std::max(scale, std::abs(r));
  int64_t bad = 0, nans = 0, worst = -1;
  double worst_excess = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double allowed =
        tol.rtol * std::abs(ref[i]) + (by_terms ? per_term * std::abs(mag[i]) : tol.atol * scale);
    const double err = std::abs(got[i] - ref[i]);
    const bool nan_here = std::isnan(got[i]) && !std::isnan(ref[i]);
    if (nan_here) ++nans;
    if (nan_here || err > allowed) {
      ++bad;
      const double excess = nan_here ? 1e300 : err - allowed;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = int64_t(i);
      }
    }
  }
  if (bad == 0) return true;
  const size_t w = size_t(worst);
  const std::string bound =
      by_terms ? fmt::format("rtol {:g}, {:g} x u({}) x Σ|terms|", tol.rtol, case_tol.terms,
                             dtype_name(case_tol.terms_dtype.value_or(device_dtype)))
               : fmt::format("rtol {:g}, atol {:g} x max|ref| {:.4g}", tol.rtol, tol.atol, scale);
  report += fmt::format(
      "  {} ({}): {} of {} elements outside tolerance ({}){}; worst element {}: gpu {:.9g}, cpu "
      "{:.9g}, |diff| {:.3g}{}\n",
      what, dtype_name(device_dtype), bad, ref.size(), bound,
      nans ? fmt::format(", {} NaN (an element the kernel never wrote keeps the 0xFF poison)", nans)
           : "",
      worst, got[w], ref[w], std::abs(got[w] - ref[w]),
      by_terms ? fmt::format(", Σ|terms| {:.4g}", mag[w]) : std::string());
  return false;
}

}  // namespace

CaseResult run_case(const OpCase& c, uint64_t seed, std::vector<std::vector<double>>* gpu_values) {
  CaseResult res;
  res.seed = seed ? seed : fresh_seed();
  std::mt19937_64 rng(res.seed);

  Built cpu, gpu;
  build(c, false, cpu);
  build(c, true, gpu);

  // One set of values for both sides, rounded to the device dtypes.
  std::vector<std::vector<double>> in_vals, w_vals(gpu.outs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i)
    in_vals.push_back(draw(c.inputs[i], c.inputs[i].dtype, rng));
  for (size_t i = 0; i < gpu.outs.size(); ++i) {
    if (gpu.weights[i] == kNoValue) continue;
    const TensorMeta& m = gpu.g.value(gpu.weights[i]).meta;
    w_vals[i] = draw(InputSpec{m.shape, m.dtype}, m.dtype, rng);
  }

  auto cpu_be = create_backend("cpu", 0);
  Executor cex(cpu.g, plan_memory(cpu.g, DeviceType::kCPU), *cpu_be, nullptr);
  cex.prepare();
  for (size_t i = 0; i < cpu.ins.size(); ++i) write_host(cex.tensor(cpu.ins[i]), in_vals[i]);
  for (size_t i = 0; i < cpu.weights.size(); ++i)
    if (cpu.weights[i] != kNoValue) write_host(cex.tensor(cpu.weights[i]), w_vals[i]);
  cex.run();
  // The references (outputs, then gradients) before any second run overwrites the arena.
  auto read_refs = [&] {
    std::vector<std::vector<double>> v;
    for (ValueId o : cpu.outs) v.push_back(read_host(cex.tensor(o)));
    for (ValueId gv : cpu.grads)
      v.push_back(gv == kNoValue ? std::vector<double>{} : read_host(cex.tensor(gv)));
    return v;
  };
  const std::vector<std::vector<double>> refs = read_refs();
  // Σ|terms| per element: the same graph on |inputs| and |weights| (see op_harness.h).
  std::vector<std::vector<double>> mags(refs.size());
  if (c.tol.terms > 0) {
    auto abs_of = [](std::vector<double> v) {
      for (double& x : v) x = std::abs(x);
      return v;
    };
    for (size_t i = 0; i < cpu.ins.size(); ++i)
      if (is_floating(c.inputs[i].dtype)) write_host(cex.tensor(cpu.ins[i]), abs_of(in_vals[i]));
    for (size_t i = 0; i < cpu.weights.size(); ++i)
      if (cpu.weights[i] != kNoValue) write_host(cex.tensor(cpu.weights[i]), abs_of(w_vals[i]));
    cex.run();
    mags = read_refs();
  }

  if (const char* dry = std::getenv("MESHTRAIN_CUDA_TEST_DRY_RUN"); dry && *dry == '1') {
    // Checks the test itself on a machine without a GPU: both graphs built (device shape
    // inference and the CUDA memory plan, workspaces included) and the CPU side run. Nothing is
    // compared: the skip recorded here makes the test skipped at best, never passed.
    (void)plan_memory(gpu.g, DeviceType::kCUDA);
    GTEST_MESSAGE_AT_(
        __FILE__, __LINE__,
        ("MESHTRAIN_CUDA_TEST_DRY_RUN=1: " + c.name + " was not run on a GPU").c_str(),
        ::testing::TestPartResult::kSkip);
    res.report = "dry run: the GPU side was not run";
    res.dry_run = true;
    return res;
  }
  Backend& be = cuda_backend();
  Executor gex(gpu.g, plan_memory(gpu.g, DeviceType::kCUDA), be, nullptr);
  gex.prepare();
  Stream& s0 = be.stream(0);
  poison_arena(gex, s0);
  auto upload = [&](ValueId v, const std::vector<double>& vals) {
    const Tensor& d = gex.tensor(v);
    Tensor h = Tensor::empty(d.shape(), d.dtype());
    write_host(h, vals);
    be.copy(d.raw(), h.raw(), h.nbytes(), CopyKind::kHostToDevice, s0);
  };
  for (size_t i = 0; i < gpu.ins.size(); ++i) upload(gpu.ins[i], in_vals[i]);
  for (size_t i = 0; i < gpu.weights.size(); ++i)
    if (gpu.weights[i] != kNoValue) upload(gpu.weights[i], w_vals[i]);
  gex.run();
  be.synchronize();

  if (gpu_values) {
    for (ValueId v : gpu.outs) gpu_values->push_back(read_host(to_host(be, gex.tensor(v))));
    for (ValueId v : gpu.grads)
      if (v != kNoValue) gpu_values->push_back(read_host(to_host(be, gex.tensor(v))));
  }
  auto check = [&](const std::string& what, size_t ref_index, ValueId gv) {
    const DType ddt = gpu.g.value(gv).meta.dtype;
    const bool exact = !is_floating(ddt) || (c.tol.rtol == 0 && c.tol.atol == 0);
    if (!compare(what, refs[ref_index], read_host(to_host(be, gex.tensor(gv))), mags[ref_index],
                 ddt, c.tol, exact, res.report))
      res.ok = false;
    ++res.compared;
  };
  for (size_t i = 0; i < gpu.outs.size(); ++i) check(fmt::format("output {}", i), i, gpu.outs[i]);
  for (size_t i = 0; i < gpu.grads.size(); ++i) {
    if ((cpu.grads[i] == kNoValue) != (gpu.grads[i] == kNoValue)) {
      res.ok = false;
      res.report += fmt::format("  gradient of input {}: present on one side only\n", i);
      continue;
    }
    if (gpu.grads[i] != kNoValue)
      check(fmt::format("d(input {})", i), gpu.outs.size() + i, gpu.grads[i]);
  }
  if (res.compared > 0) note_compared_graph(gpu.g);
  return res;
}

void expect_case(const OpCase& c) {
  SCOPED_TRACE(c.name);
  CaseResult r = run_case(c);
  if (r.dry_run) return;  // run_case recorded the skip
  EXPECT_GT(r.compared, 0) << c.name << ": nothing was compared";
  EXPECT_TRUE(r.ok) << c.name << " (seed " << r.seed << ") differs from the CPU reference:\n"
                    << r.report;
}

}  // namespace meshtrain::cudatest
