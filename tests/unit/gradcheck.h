// Finite-difference gradient checking through the real path: build a graph with the op under
// test, differentiate it with autodiff, run it with the CPU executor, and compare every analytic
// gradient with central differences in float64. Tests that gradcheck an op declare it with
// MT_GRADCHECK_TEST (common/op_coverage.h); gradcheck reports the ops it differentiated through.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/op_coverage.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing {

struct InputSpec {
  Shape shape;
  DType dtype = DType::kF64;
  bool differentiable = true;
  // Integer inputs (indices, labels) are drawn uniformly from [0, int_high).
  int64_t int_high = 0;
  // Float inputs are drawn uniformly from [lo, hi); or set `values` to fix them.
  double lo = -1.0, hi = 1.0;
  std::vector<double> values;
};

struct GradCheckOptions {
  double eps = 1e-6;
  double tolerance = 1e-6;          // max |analytic - numeric| / max(|numeric|_inf, floor)
  double floor = 1e-3;              // keeps relative error meaningful for tiny gradients
  int max_elements_per_input = 48;  // sampled elements per input (all when fewer)
  uint64_t seed = 0;                // 0: a fresh seed each run (printed on failure)
};

struct GradCheckReport {
  double max_rel_error = 0;
  std::string worst;  // which input/element
  uint64_t seed = 0;
  int checked = 0;
};

using BuildFn = std::function<std::vector<ValueId>(Builder&, const std::vector<ValueId>&)>;

GradCheckReport gradcheck(const std::vector<InputSpec>& inputs, const BuildFn& build,
                          GradCheckOptions options = {});

// Runs `build` forward only on the given host tensors; returns the outputs (CPU executor).
std::vector<Tensor> run_forward(const std::vector<Tensor>& inputs, const BuildFn& build);

uint64_t fresh_seed();

// The acceptance bar of every op gradcheck: something was checked and max relative error <= tol.
void expect_grad_ok(const GradCheckReport& report, double tolerance = 1e-6);

}  // namespace meshtrain::testing
