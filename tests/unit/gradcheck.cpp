// gradcheck implementation: loss = Σ_i sum(out_i ⊙ r_i) with fixed random r_i, so every output
// element contributes with its own weight.
#include "gradcheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "common/op_coverage.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain::testing {

uint64_t fresh_seed() {
  if (const char* env = std::getenv("MESHTRAIN_TEST_SEED"); env && *env)
    return std::strtoull(env, nullptr, 10);
  return uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count()) | 1;
}

namespace {
void fill_input(const Tensor& t, const InputSpec& s, std::mt19937_64& rng) {
  int64_t n = t.numel();
  if (!s.values.empty()) {
    MT_CHECK(int64_t(s.values.size()) == n, "InputSpec values size");
  }
  for (int64_t i = 0; i < n; ++i) {
    double v;
    if (!s.values.empty()) {
      v = s.values[size_t(i)];
    } else if (!is_floating(s.dtype)) {
      v = double(
          std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(s.int_high, 1) - 1)(rng));
    } else {
      v = std::uniform_real_distribution<double>(s.lo, s.hi)(rng);
    }
    switch (s.dtype) {
      case DType::kF64: static_cast<double*>(t.raw())[i] = v; break;
      case DType::kF32: static_cast<float*>(t.raw())[i] = float(v); break;
      case DType::kI64: static_cast<int64_t*>(t.raw())[i] = int64_t(v); break;
      case DType::kI32: static_cast<int32_t*>(t.raw())[i] = int32_t(v); break;
      case DType::kBF16: static_cast<BFloat16*>(t.raw())[i] = BFloat16(float(v)); break;
    }
  }
}

// The ops whose gradient this check covers: nodes the test's build made (ids in [first, end))
// that read a value depending on a differentiated input and whose outputs reach a checked output.
std::vector<std::string> differentiated_ops(const Graph& g, NodeId first, NodeId end,
                                            const std::vector<ValueId>& wrt,
                                            const std::vector<ValueId>& outs) {
  std::vector<bool> carries(size_t(g.num_values()), false), reaches(size_t(g.num_values()), false);
  for (ValueId v : wrt) carries[size_t(v)] = true;
  for (ValueId v : outs) reaches[size_t(v)] = true;
  std::vector<bool> on_path(size_t(end), false);
  for (NodeId n = first; n < end; ++n) {
    const Node& node = g.node(n);
    for (ValueId v : node.inputs)
      if (carries[size_t(v)]) on_path[size_t(n)] = true;
    if (on_path[size_t(n)])
      for (ValueId v : node.outputs) carries[size_t(v)] = true;
  }
  std::vector<std::string> ops;
  for (NodeId n = end - 1; n >= first; --n) {
    const Node& node = g.node(n);
    bool used = false;
    for (ValueId v : node.outputs) used = used || reaches[size_t(v)];
    if (!used) continue;
    for (ValueId v : node.inputs) reaches[size_t(v)] = true;
    if (on_path[size_t(n)]) ops.push_back(node.op);
  }
  return ops;
}

double read(const Tensor& t, int64_t i) { return t.item_as_double(i); }
void write(const Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::kF64)
    static_cast<double*>(t.raw())[i] = v;
  else
    static_cast<float*>(t.raw())[i] = float(v);
}
}  // namespace

GradCheckReport gradcheck(const std::vector<InputSpec>& specs, const BuildFn& build,
                          GradCheckOptions opt) {
  GradCheckReport report;
  report.seed = opt.seed ? opt.seed : fresh_seed();
  std::mt19937_64 rng(report.seed);

  Graph g;
  Builder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < specs.size(); ++i)
    ins.push_back(b.input(fmt::format("x{}", i), {specs[i].shape, specs[i].dtype}));
  const NodeId build_first = NodeId(g.num_nodes());
  std::vector<ValueId> outs = build(b, ins);
  const NodeId build_end = NodeId(g.num_nodes());
  std::vector<ValueId> weights;
  ValueId loss = kNoValue;
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorMeta& m = b.meta(outs[i]);
    ValueId w = b.input(fmt::format("r{}", i), m);
    weights.push_back(w);
    ValueId term = ops::sum(b, ops::mul(b, outs[i], w));
    loss = loss == kNoValue ? term : ops::add(b, loss, term);
  }
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].differentiable) wrt.push_back(ins[i]);
  GradientMap grads = differentiate(g, loss, wrt);
  g.mark_output(loss);
  for (ValueId v : wrt)
    if (grads.grad_of(v) != kNoValue) g.mark_output(grads.grad_of(v));
  eliminate_dead_nodes(g);

  auto backend = create_backend("cpu", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *backend, nullptr);
  ex.prepare();
  for (size_t i = 0; i < specs.size(); ++i) fill_input(ex.tensor(ins[i]), specs[i], rng);
  for (ValueId w : weights) {
    InputSpec ws{b.shape(w), b.dtype(w)};
    fill_input(ex.tensor(w), ws, rng);
  }
  ex.run();

  // Snapshot analytic gradients before perturbing (later runs overwrite the arena).
  std::vector<std::vector<double>> analytic(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].differentiable) continue;
    ValueId gv = grads.grad_of(ins[i]);
    int64_t n = specs[i].shape.numel();
    analytic[i].assign(size_t(n), 0.0);
    if (gv == kNoValue) continue;
    for (int64_t k = 0; k < n; ++k) analytic[i][size_t(k)] = read(ex.tensor(gv), k);
  }

  auto eval_loss = [&]() {
    ex.run();
    return read(ex.tensor(loss), 0);
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].differentiable) continue;
    const Tensor& x = ex.tensor(ins[i]);
    int64_t n = x.numel();
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) idx[size_t(k)] = k;
    std::shuffle(idx.begin(), idx.end(), rng);
    if (int64_t(idx.size()) > opt.max_elements_per_input)
      idx.resize(size_t(opt.max_elements_per_input));
    double max_num = 0, max_diff = 0;
    int64_t worst = -1;
    for (int64_t k : idx) {
      double orig = read(x, k);
      write(x, k, orig + opt.eps);
      double lp = eval_loss();
      write(x, k, orig - opt.eps);
      double lm = eval_loss();
      write(x, k, orig);
      double num = (lp - lm) / (2 * opt.eps);
      double diff = std::abs(num - analytic[i][size_t(k)]);
      max_num = std::max(max_num, std::abs(num));
      if (diff > max_diff) {
        max_diff = diff;
        worst = k;
      }
      ++report.checked;
    }
    double rel = max_diff / std::max(max_num, opt.floor);
    if (rel > report.max_rel_error) {
      report.max_rel_error = rel;
      report.worst = fmt::format("input {} element {}: analytic {} (max |numeric| {})", i, worst,
                                 worst >= 0 ? analytic[i][size_t(worst)] : 0.0, max_num);
    }
  }
  if (report.checked > 0)
    note_checked(Check::kGradcheck, differentiated_ops(g, build_first, build_end, wrt, outs));
  return report;
}

void expect_grad_ok(const GradCheckReport& r, double tolerance) {
  EXPECT_GT(r.checked, 0);
  EXPECT_LE(r.max_rel_error, tolerance) << r.worst << " (seed " << r.seed << ")";
}

std::vector<Tensor> run_forward(const std::vector<Tensor>& inputs, const BuildFn& build) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(b.input(fmt::format("x{}", i), {inputs[i].shape(), inputs[i].dtype()}));
  std::vector<ValueId> outs = build(b, ins);
  for (ValueId o : outs) g.mark_output(o);
  auto backend = create_backend("cpu", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *backend, nullptr);
  ex.prepare();
  for (size_t i = 0; i < inputs.size(); ++i) ex.tensor(ins[i]).copy_from_host(inputs[i]);
  ex.run();
  std::vector<Tensor> result;
  for (ValueId o : outs) {
    const Tensor& t = ex.tensor(o);
    Tensor copy = Tensor::empty(t.shape(), t.dtype());
    copy.copy_from_host(t);
    result.push_back(copy);
  }
  return result;
}

}  // namespace meshtrain::testing
