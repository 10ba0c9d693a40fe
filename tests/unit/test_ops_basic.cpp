// Gradient checks and forward checks for the elementwise ops and matmul.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

MT_GRADCHECK_TEST(GradCheck, AddMulScale, "add", "mul", "scale") {
  Shape s{3, 5};
  expect_grad_ok(gradcheck({{s}, {s}}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::scale(b, ops::add(b, ops::mul(b, x[0], x[1]), x[0]), -1.5)};
  }));
}

MT_GRADCHECK_TEST(GradCheck, CastRoundTripAndReshape, "cast", "reshape") {
  expect_grad_ok(gradcheck({{Shape{4, 6}}},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             ValueId y = ops::cast(b, ops::cast(b, x[0], DType::kF32), DType::kF64);
                             return std::vector<ValueId>{ops::reshape(b, y, Shape{2, 12})};
                             // Linear in x, so a large step has no truncation error and swamps
                             // float32 rounding.
                           },
                           {.eps = 0.5}));
}

MT_GRADCHECK_TEST(GradCheck, MatmulAllTransposes, "matmul") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Shape a = ta ? Shape{7, 4} : Shape{2, 2, 7};  // M=4 (or 2x2), K=7
      Shape bs = tb ? Shape{5, 7} : Shape{7, 5};
      if (ta) a = Shape{7, 4};
      auto r = gradcheck({{a}, {bs}}, [&](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::matmul(b, x[0], x[1], ta, tb)};
      });
      SCOPED_TRACE(fmt::format("ta={} tb={}", ta, tb));
      expect_grad_ok(r);
    }
}

// sum reduces to [1], expand_scalar broadcasts it back; grad_cast is a view forward whose backward
// casts the gradient to its dtype (float32 here: the float64 input's gradient arrives rounded to
// float32, ~6e-8 relative, well inside the tolerance).
MT_GRADCHECK_TEST(GradCheck, SumExpandScalarAndGradCast, "sum", "expand_scalar", "grad_cast") {
  expect_grad_ok(
      gradcheck({{Shape{4, 7}}, {Shape{3, 5}}}, [](Builder& b, const std::vector<ValueId>& x) {
        ValueId s = ops::sum(b, ops::mul(b, x[0], x[0]));
        ValueId e = ops::expand_scalar(b, s, Shape{3, 5});
        ValueId g = ops::grad_cast(b, x[1], DType::kF32);
        return std::vector<ValueId>{s, ops::mul(b, e, g)};
      }));
}

TEST(Ops, MatmulForwardMatchesNaive) {
  std::vector<double> a = {1, 2, 3, 4, 5, 6};      // [2,3]
  std::vector<double> bm = {1, 0, -1, 2, 0.5, 1};  // [3,2]
  auto out = testing::run_forward(
      {Tensor::from_vector(a, Shape{2, 3}), Tensor::from_vector(bm, Shape{3, 2})},
      [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::matmul(b, x[0], x[1])};
      });
  std::vector<double> got = out[0].to_vector<double>();
  std::vector<double> want = {1 * 1 + 2 * -1 + 3 * 0.5, 0 + 4 + 3, 4 - 5 + 3, 0 + 10 + 6};
  EXPECT_EQ(got, want);
}

TEST(Ops, MatmulInnerDimMismatchNamesShapes) {
  Graph g;
  Builder b(g);
  auto s = b.scope("layers.0.attention");
  ValueId x = b.input("x", {Shape{2, 3}, DType::kF32});
  ValueId w = b.input("w", {Shape{4, 5}, DType::kF32});
  try {
    ops::linear(b, x, w);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layers.0.attention"), std::string::npos) << m;
    EXPECT_NE(m.find("inner dimensions differ"), std::string::npos) << m;
  }
}

TEST(Ops, CastToBf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1+2^-7: ties go to even (1.0).
  std::vector<float> v = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f};
  auto out = testing::run_forward(
      {Tensor::from_vector(v, Shape{3})}, [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::cast(b, ops::cast(b, x[0], DType::kBF16), DType::kF32)};
      });
  std::vector<float> got = out[0].to_vector<float>();
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + 4.0f / 256);
  EXPECT_EQ(got[2], -2.5f);
}

}  // namespace
}  // namespace meshtrain
