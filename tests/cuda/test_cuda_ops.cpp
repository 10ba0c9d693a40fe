// CPU-vs-CUDA checks of the elementwise, cast, reduction and structural ops, forward and
// backward (see op_harness.h for inputs, poisoning and tolerances). Each test declares the ops it
// covers (MT_CUDA_CASE_TEST); test_cuda_coverage.cpp names any op with a CUDA kernel that no test
// covers.
#include <gtest/gtest.h>

#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "op_harness.h"

namespace meshtrain::cudatest {
namespace {

using V = std::vector<ValueId>;
const DType kFloatDtypes[] = {DType::kF32, DType::kBF16, DType::kF64};

MT_CUDA_CASE_TEST(CudaOps, AddMulScale, "add", "mul", "scale") {
  for (DType dt : kFloatDtypes)
    for (Shape s : {Shape{1000, 33}, Shape{4096}, Shape{3}}) {
      expect_case({.name = fmt::format("add/{}/{}", dtype_name(dt), s),
                   .inputs = {{s, dt}, {s, dt}},
                   .build = [](Builder& b, const V& x) { return V{ops::add(b, x[0], x[1])}; }});
      expect_case({.name = fmt::format("mul/{}/{}", dtype_name(dt), s),
                   .inputs = {{s, dt}, {s, dt}},
                   .build = [](Builder& b, const V& x) { return V{ops::mul(b, x[0], x[1])}; }});
      expect_case({.name = fmt::format("scale/{}/{}", dtype_name(dt), s),
                   .inputs = {{s, dt}},
                   .build = [](Builder& b, const V& x) { return V{ops::scale(b, x[0], -1.37)}; }});
    }
}

MT_CUDA_CASE_TEST(CudaOps, FillEveryDtype, "fill") {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64})
    for (double value : {2.75, -1.0 / 3.0, 0.0})
      expect_case({.name = fmt::format("fill/{}/{}", dtype_name(dt), value),
                   .build =
                       [dt, value](Builder& b, const V&) {
                         return V{ops::fill(b, Shape{37, 5}, dt, value)};
                       },
                   .same_dtypes_on_cpu = true,
                   .tol = {0, 0}});
}

// Every dtype pair, with the CPU computing in the same dtypes: conversions must match bit for bit
// (bf16 rounds to nearest even through float32, float -> int truncates).
MT_CUDA_CASE_TEST(CudaOps, CastEveryDtypePairExactly, "cast") {
  const DType all[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64};
  for (DType from : all)
    for (DType to : all) {
      if (from == to) continue;
      InputSpec in{Shape{513, 3}, from};
      in.lo = -300.0, in.hi = 300.0;
      in.int_lo = -100000, in.int_hi = 100000;
      in.differentiable = is_floating(from);
      expect_case({.name = fmt::format("cast/{}->{}", dtype_name(from), dtype_name(to)),
                   .inputs = {in},
                   .build = [to](Builder& b, const V& x) { return V{ops::cast(b, x[0], to)}; },
                   .backward = is_floating(from) && is_floating(to),
                   .same_dtypes_on_cpu = true,
                   .tol = {0, 0}});
    }
}

MT_CUDA_CASE_TEST(CudaOps, ReshapeAndGradCast, "reshape", "grad_cast") {
  for (DType dt : {DType::kF32, DType::kBF16})
    expect_case({.name = fmt::format("reshape/{}", dtype_name(dt)),
                 .inputs = {{Shape{6, 20}, dt}, {Shape{4, 30}, dt}},
                 .build = [](Builder& b, const V& x) {
                   return V{ops::mul(b, ops::reshape(b, x[0], Shape{4, 30}), x[1])};
                 }});
  // grad_cast is a view forward; backward casts the bf16 gradient to float32 (rounded once in
  // bf16 by the mul's backward, hence the bf16 tolerance on a float32 gradient).
  expect_case({.name = "grad_cast/bf16->f32",
               .inputs = {{Shape{300}, DType::kBF16}, {Shape{300}, DType::kBF16}},
               .build =
                   [](Builder& b, const V& x) {
                     return V{ops::mul(b, ops::grad_cast(b, x[0], DType::kF32), x[1])};
                   },
               .tol = {1e-2, 4e-3}});
}

MT_CUDA_CASE_TEST(CudaOps, SumAndExpandScalar, "sum", "expand_scalar") {
  for (DType dt : kFloatDtypes)
    for (Shape s : {Shape{100003}, Shape{7}, Shape{64, 65}}) {
      expect_case({.name = fmt::format("sum/{}/{}", dtype_name(dt), s),
                   .inputs = {{s, dt}},
                   .build = [](Builder& b, const V& x) { return V{ops::sum(b, x[0])}; }});
      expect_case(
          {.name = fmt::format("expand_scalar/{}/{}", dtype_name(dt), s),
           .inputs = {{Shape{1}, dt}},
           .build = [s](Builder& b, const V& x) { return V{ops::expand_scalar(b, x[0], s)}; }});
    }
}

TEST(CudaOps, SumIsBitwiseReproducible) {
  OpCase c{.name = "sum/f32/reproducible",
           .inputs = {{Shape{1 << 20}, DType::kF32}},
           .build = [](Builder& b, const V& x) { return V{ops::sum(b, x[0])}; }};
  std::vector<std::vector<double>> a, b;
  const uint64_t seed = fresh_seed();
  EXPECT_TRUE(run_case(c, seed, &a).ok);
  EXPECT_TRUE(run_case(c, seed, &b).ok);
  EXPECT_EQ(a, b) << "seed " << seed;
}

// Copies run on raw words (16/8/4/2 bytes by alignment); int32 and odd inner sizes cover the
// narrow words, float dtypes the gradient paths.
MT_CUDA_CASE_TEST(CudaOps, SliceConcatExpandSumDim, "slice", "slice_backward", "concat", "expand",
                  "sum_dim") {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
    const bool grad = is_floating(dt);
    InputSpec x{Shape{5, 12, 7}, dt};
    x.int_lo = -1000, x.int_hi = 1000;
    x.differentiable = grad;
    const std::string t = dtype_name(dt);
    for (auto [dim, start, len] : {std::tuple{1, 3, 6}, std::tuple{-1, 2, 4}, std::tuple{0, 1, 3}})
      expect_case(
          {.name = fmt::format("slice/{}/dim{}[{}:+{}]", t, dim, start, len),
           .inputs = {x},
           .build = [=](Builder& b, const V& v) { return V{ops::slice(b, v[0], dim, start, len)}; },
           .backward = grad});
    InputSpec dy{Shape{5, 6, 7}, dt};
    dy.int_lo = -1000, dy.int_hi = 1000;
    dy.differentiable = grad;
    expect_case(
        {.name = fmt::format("slice_backward/{}", t),
         .inputs = {dy},
         .build = [](Builder& b, const V& v) { return V{ops::slice_backward(b, v[0], 1, 3, 12)}; },
         .backward = false});
    for (int dim : {0, 1, -1}) {
      std::vector<InputSpec> parts;
      for (int64_t e : {3, 2, 6}) {
        Shape s = Shape{4, 3, 5}.with(dim, e);
        InputSpec p{s, dt};
        p.int_lo = -1000, p.int_hi = 1000;
        p.differentiable = grad;
        parts.push_back(p);
      }
      expect_case({.name = fmt::format("concat/{}/dim{}", t, dim),
                   .inputs = parts,
                   .build = [dim](Builder& b, const V& v) { return V{ops::concat(b, v, dim)}; },
                   .backward = grad});
    }
    for (auto [shape, dim, n] : {std::tuple{Shape{4, 1, 6}, 1, 5}, std::tuple{Shape{3, 1}, 1, 8},
                                 std::tuple{Shape{1, 9}, 0, 3}}) {
      InputSpec e{shape, dt};
      e.int_lo = -1000, e.int_hi = 1000;
      e.differentiable = grad;
      expect_case(
          {.name = fmt::format("expand/{}/{}/dim{}x{}", t, shape, dim, n),
           .inputs = {e},
           .build = [dim, n](Builder& b, const V& v) { return V{ops::expand(b, v[0], dim, n)}; },
           .backward = grad});
    }
    if (grad)
      for (int dim : {0, 1, -1})
        expect_case(
            {.name = fmt::format("sum_dim/{}/dim{}", t, dim),
             .inputs = {{Shape{4, 9, 6}, dt}},
             .build = [dim](Builder& b, const V& v) { return V{ops::sum_dim(b, v[0], dim)}; }});
  }
}

MT_CUDA_CASE_TEST(CudaOps, Transpose01, "transpose01") {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32}) {
    const bool grad = is_floating(dt);
    for (Shape s : {Shape{5, 7, 3}, Shape{4, 6}, Shape{33, 17, 2, 8}}) {
      InputSpec x{s, dt};
      x.int_lo = -1000, x.int_hi = 1000;
      x.differentiable = grad;
      expect_case({.name = fmt::format("transpose01/{}/{}", dtype_name(dt), s),
                   .inputs = {x},
                   .build = [](Builder& b, const V& v) { return V{ops::transpose01(b, v[0])}; },
                   .backward = grad,
                   .tol = {0, 0}});  // a copy: exact
    }
  }
}

}  // namespace
}  // namespace meshtrain::cudatest
