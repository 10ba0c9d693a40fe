// slice, concat, expand, sum_dim: forward against naive index arithmetic (negative dims too, and
// an int32 concat since the copies are dtype-agnostic), float64 gradchecks, and range errors;
// Tensor::reseat_rows, the in-place re-view of a moving workspace.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

// x[i][j][k] = 100 i + 10 j + k: every element names its index.
std::vector<double> iota3(int64_t a, int64_t b, int64_t c) {
  std::vector<double> v;
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < c; ++k) v.push_back(double(100 * i + 10 * j + k));
  return v;
}

std::vector<double> run1(const std::vector<Tensor>& in,
                         const std::function<ValueId(Builder&, const std::vector<ValueId>&)>& f,
                         Shape* shape = nullptr) {
  auto out = testing::run_forward(
      in, [&](Builder& b, const std::vector<ValueId>& x) { return std::vector<ValueId>{f(b, x)}; });
  if (shape) *shape = out[0].shape();
  return out[0].to_vector<double>();
}

TEST(OpsShape, SliceForwardWithNegativeDim) {
  Tensor x = Tensor::from_vector(iota3(2, 5, 3), Shape{2, 5, 3});
  for (int dim : {1, -2}) {
    Shape s;
    std::vector<double> got = run1(
        {x},
        [&](Builder& b, const std::vector<ValueId>& v) { return ops::slice(b, v[0], dim, 1, 3); },
        &s);
    EXPECT_EQ(s, (Shape{2, 3, 3}));
    std::vector<double> want;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 1; j < 4; ++j)
        for (int64_t k = 0; k < 3; ++k) want.push_back(double(100 * i + 10 * j + k));
    EXPECT_EQ(got, want) << "dim " << dim;
  }
}

TEST(OpsShape, SliceBackwardPlacesIntoZeros) {
  Tensor dy = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, Shape{2, 2});
  Shape s;
  std::vector<double> got = run1(
      {dy},
      [](Builder& b, const std::vector<ValueId>& v) {
        return ops::slice_backward(b, v[0], -1, 1, 4);
      },
      &s);
  EXPECT_EQ(s, (Shape{2, 4}));
  EXPECT_EQ(got, (std::vector<double>{0, 1, 2, 0, 0, 3, 4, 0}));
}

TEST(OpsShape, ConcatForwardAlongMiddleAndLastDim) {
  Tensor a = Tensor::from_vector(iota3(2, 2, 3), Shape{2, 2, 3});
  Tensor b1 = Tensor::from_vector(std::vector<double>{-1, -2, -3, -4, -5, -6}, Shape{2, 1, 3});
  std::vector<double> got = run1({a, b1}, [](Builder& b, const std::vector<ValueId>& v) {
    return ops::concat(b, {v[0], v[1]}, 1);
  });
  std::vector<double> want = {0,   1,   2,   10,  11,  12,  -1, -2, -3,
                              100, 101, 102, 110, 111, 112, -4, -5, -6};
  EXPECT_EQ(got, want);

  Tensor c = Tensor::from_vector(std::vector<double>{7, 8, 9, 10}, Shape{2, 2, 1});
  Shape s;
  got = run1(
      {a, c},
      [](Builder& b, const std::vector<ValueId>& v) {
        return ops::concat(b, {v[0], v[1]}, -1);
      },
      &s);
  EXPECT_EQ(s, (Shape{2, 2, 4}));
  want = {0, 1, 2, 7, 10, 11, 12, 8, 100, 101, 102, 9, 110, 111, 112, 10};
  EXPECT_EQ(got, want);
}

TEST(OpsShape, ConcatCopiesIntegerTensors) {
  Tensor a = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, Shape{2, 2});
  Tensor b1 = Tensor::from_vector(std::vector<int32_t>{5, 6}, Shape{1, 2});
  auto out = testing::run_forward({a, b1}, [](Builder& b, const std::vector<ValueId>& v) {
    return std::vector<ValueId>{ops::concat(b, {v[0], v[1]}, 0)};
  });
  EXPECT_EQ(out[0].to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

TEST(OpsShape, ExpandAndSumDimForward) {
  Tensor x = Tensor::from_vector(iota3(2, 1, 3), Shape{2, 1, 3});
  Shape s;
  std::vector<double> got = run1(
      {x}, [](Builder& b, const std::vector<ValueId>& v) { return ops::expand(b, v[0], -2, 3); },
      &s);
  EXPECT_EQ(s, (Shape{2, 3, 3}));
  std::vector<double> want;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 3; ++k) want.push_back(double(100 * i + k));
  EXPECT_EQ(got, want);

  Tensor y = Tensor::from_vector(iota3(2, 3, 2), Shape{2, 3, 2});
  got = run1(
      {y}, [](Builder& b, const std::vector<ValueId>& v) { return ops::sum_dim(b, v[0], 1); }, &s);
  EXPECT_EQ(s, (Shape{2, 1, 2}));
  // sum_j (100 i + 10 j + k) = 300 i + 30 + 3 k
  EXPECT_EQ(got, (std::vector<double>{30, 33, 330, 333}));
}

MT_GRADCHECK_TEST(OpsShape, GradCheckSlice, "slice") {
  expect_grad_ok(gradcheck({{Shape{3, 6, 2}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::slice(b, x[0], -2, 2, 3)};
  }));
}

MT_GRADCHECK_TEST(OpsShape, GradCheckConcat, "concat") {
  auto build = [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::concat(b, {x[0], x[1], x[2]}, 1)};
  };
  expect_grad_ok(gradcheck({{Shape{2, 3, 4}}, {Shape{2, 1, 4}}, {Shape{2, 2, 4}}}, build));
  // A fixed middle input: the rule must still slice the right windows for the others.
  InputSpec fixed{Shape{2, 1, 4}, DType::kF64, false};
  expect_grad_ok(gradcheck({{Shape{2, 3, 4}}, fixed, {Shape{2, 2, 4}}}, build));
}

MT_GRADCHECK_TEST(OpsShape, GradCheckExpandAndSumDim, "expand", "sum_dim") {
  expect_grad_ok(gradcheck({{Shape{2, 3, 1}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::expand(b, x[0], 2, 5)};
  }));
  expect_grad_ok(gradcheck({{Shape{4, 3, 2}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::sum_dim(b, x[0], 0)};
  }));
}

template <typename F>
void expect_shape_error(F f, const std::string& want) {
  try {
    f();
    FAIL() << "expected a ShapeError containing: " << want;
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(OpsShape, BadArgumentsNameTheProblem) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{2, 5, 3}, DType::kF32});
  ValueId y = b.input("y", {Shape{2, 4, 4}, DType::kF32});
  ValueId z = b.input("z", {Shape{2, 5, 3}, DType::kF64});
  expect_shape_error([&] { ops::slice(b, x, 1, 3, 3); },
                     "slice [3, 6) of dim 1 is outside its extent 5");
  expect_shape_error([&] { ops::slice(b, x, 3, 0, 1); },
                     "dimension 3 out of range for shape [2, 5, 3]");
  expect_shape_error(
      [&] {
        ops::concat(b, {x, y}, 1);
      },
      "input 1 has shape [2, 4, 4], input 0 has [2, 5, 3]");
  expect_shape_error(
      [&] {
        ops::concat(b, {x, z}, 0);
      },
      "input 1 has dtype float64, expected float32");
  expect_shape_error([&] { ops::expand(b, x, 1, 4); },
                     "dim 1 of [2, 5, 3] must have extent 1, found 5");
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {
MT_GRADCHECK_TEST(ShapeOps, Transpose01SwapsTheLeadingDimsAndIsItsOwnBackward, "transpose01") {
  std::vector<double> v(2 * 3 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i);
  auto out = testing::run_forward({Tensor::from_vector(v, Shape{2, 3, 2})},
                                  [](Builder& b, const std::vector<ValueId>& x) {
                                    return std::vector<ValueId>{ops::transpose01(b, x[0])};
                                  });
  EXPECT_EQ(out[0].shape(), (Shape{3, 2, 2}));
  // out[q][p] = in[p][q]
  EXPECT_EQ(out[0].to_vector<double>(),
            (std::vector<double>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
  testing::expect_grad_ok(
      testing::gradcheck({{Shape{3, 4, 5}}}, [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::transpose01(b, x[0])};
      }));
}

// The expert exchange re-views its workspace as [n, D] rows whenever the row-capacity pool moves
// it: the view follows the new memory, keeps D and the dtype, and refuses rows past the storage.
TEST(Tensor, ReseatRowsFollowsNewMemoryAndKeepsTrailingExtents) {
  Tensor a = Tensor::empty(Shape{64}, DType::kF32), b = Tensor::empty(Shape{32}, DType::kF32);
  Tensor rows(a.storage(), 0, Shape{16, 4}, DType::kF32);
  rows.reseat_rows(b.storage(), 16, 4);  // b from its 5th float on, as 4 rows of 4
  EXPECT_EQ(rows.shape(), (Shape{4, 4}));
  EXPECT_EQ(rows.raw(), static_cast<char*>(b.raw()) + 16);
  EXPECT_EQ(rows.dtype(), DType::kF32);
  EXPECT_THROW(rows.reseat_rows(b.storage(), 16, 8), Error);  // 8 × 16 bytes from 16 > 128
  EXPECT_EQ(rows.shape(), (Shape{4, 4}));                     // a refused reseat changes nothing
  EXPECT_EQ(rows.raw(), static_cast<char*>(b.raw()) + 16);
}
}  // namespace
}  // namespace meshtrain
