// CPU-vs-CUDA op checks through the real path: the same BuildFn is built twice, once with the
// CPU reference dtypes (float64 for float32/float64 device inputs, float32 for bf16 ones, since
// the CPU kernels compute in float32/float64 only) and once with the device dtypes; autodiff runs
// on both (loss = Σ sum(out_i ⊙ r_i) with random r_i, as in tests/unit/gradcheck.h); both
// executors run on the same input values (drawn fresh each run, rounded to the device dtype, so
// both sides see identical numbers); every CUDA arena byte is poisoned with 0xFF (NaN in every
// float dtype) before the run, so an unwritten output element shows as NaN; then outputs and
// gradients are compared element by element.
//
// Tolerance: an element passes when |gpu - ref| <= rtol·|ref| + atol·max|ref| (max over that
// tensor). Defaults per device dtype:
//   float32 vs float64 CPU: rtol 1e-5, atol 1e-6 — float rounding (~6e-8 per operation) through
//     row reductions of up to a few thousand terms, and cancellation in near-zero elements.
//   bfloat16 vs float32 CPU: rtol 1e-2, atol 4e-3 — the kernels compute in float32 and round
//     their output once to bf16 (up to 2^-9 ≈ 2e-3 relative), plus the bf16 rounding of the
//     intermediate values a graph stores (an op's output that feeds its backward); a few ops with
//     long bf16 chains set their own.
//   float64 vs float64 CPU: rtol 1e-12, atol 1e-13.
//   integers and casts: exact.
// Sums that cancel: atol x max|ref| cannot bound an element whose summed terms are large but
// nearly cancel (a bf16 rounding of each term is then larger than the result). A case built only
// of ops that are sums of products of their inputs (permutes, GEMMs, combines, casts) sets
// Tolerance::terms: the harness runs the CPU graph a second time on |inputs| and |loss weights|,
// which gives each element's Σ|terms|, and an element passes when
//   |gpu - ref| <= rtol·|ref| + terms · u · Σ|terms|
// with u the device dtype's unit roundoff (bf16 2^-8, float32 2^-24, float64 2^-53); `terms` is
// then the number of roundings on the longest path plus a margin for the accumulation order.
//
// Seeds: every case draws a fresh seed, printed with a failure; MESHTRAIN_TEST_SEED=N makes
// every case use N, which reproduces the failing one.
#pragma once

#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/op_coverage.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::cudatest {

struct InputSpec {
  Shape shape;
  DType dtype = DType::kF32;  // the device dtype
  bool differentiable = true;
  double lo = -1.0, hi = 1.0;      // floats: uniform in [lo, hi)
  int64_t int_lo = 0, int_hi = 1;  // integers: uniform in [int_lo, int_hi)
  // Custom values (element index -> value), drawn each run; overrides the ranges.
  std::function<double(std::mt19937_64&, int64_t)> gen;
};

struct Tolerance {
  double rtol = -1, atol = -1;  // < 0: the dtype default
  double terms = -1;            // > 0: bound by Σ|terms| (see above); atol is then unused
  // The dtype whose unit roundoff u the Σ|terms| bound uses; std::nullopt: each compared
  // tensor's own dtype. A float32 gradient computed through a bf16 chain (the MoE scores in a
  // bf16 run) carries the chain's roundings, so its bound takes bf16's u.
  std::optional<DType> terms_dtype;
};

using BuildFn = std::function<std::vector<ValueId>(Builder&, const std::vector<ValueId>&)>;

struct OpCase {
  std::string name;  // printed with every failure, e.g. "rmsnorm/bf16/D=256"
  std::vector<InputSpec> inputs;
  BuildFn build;
  bool backward = true;
  // true: the CPU graph uses the device dtypes unchanged (casts: their semantics are dtype's).
  bool same_dtypes_on_cpu = false;
  Tolerance tol;
};

struct CaseResult {
  bool ok = true;
  bool dry_run = false;  // MESHTRAIN_CUDA_TEST_DRY_RUN: nothing was compared (the test is skipped)
  std::string report;    // one line per failing tensor: worst element, both values, tolerance
  uint64_t seed = 0;
  int compared = 0;  // tensors compared
};

// Builds, runs and compares one case; seed 0 draws a fresh seed (printed in the report).
// `gpu_values`, when given, receives the GPU's outputs then gradients (determinism checks).
// The ops of the compared GPU graph count as checked for the running MT_CUDA_CASE_TEST.
CaseResult run_case(const OpCase& c, uint64_t seed = 0,
                    std::vector<std::vector<double>>* gpu_values = nullptr);

// gtest helper: runs the case and reports failures with the case name.
// MESHTRAIN_CUDA_TEST_DRY_RUN=1 (machines without a GPU, for checking the tests themselves)
// builds both graphs and runs the CPU side only; the test is then reported as skipped, never as
// passed (run_case records the skip, whoever calls it).
void expect_case(const OpCase& c);

// For GPU tests that run their own graphs: the live ops of `g`, once its results were compared
// with the CPU's, count as checked for the running MT_CUDA_CASE_TEST.
void note_compared_graph(const Graph& g);

DType reference_dtype(DType device_dtype);
Tolerance default_tolerance(DType device_dtype);
double unit_roundoff(DType device_dtype);
uint64_t fresh_seed();

}  // namespace meshtrain::cudatest
