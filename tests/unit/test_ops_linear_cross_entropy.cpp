// linear_cross_entropy against the unfused graph (linear, cross_entropy, cross_entropy_backward
// and the two gradient matmuls) on the CPU: loss, dh and dw with ignored labels, N not a multiple
// of chunk_rows and chunk_rows beyond N; the loss-only form; the float64 gradcheck through its
// scale_by backward; scale_by / scale_by_accumulate; the shape and label errors.
#include <gtest/gtest.h>

#include <random>

#include "gradcheck.h"
#include "meshtrain/graph/passes/fuse_grad_matmul.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/ops/matmul.h"
#include "step_graph_fixtures.h"

namespace meshtrain {
namespace {
using testing::expect_grad_ok;
using testing::gradcheck;
using testing::InputSpec;

struct Problem {
  int64_t n, d, v;
  std::vector<double> h, w;
  std::vector<int32_t> labels;
  int64_t count = 0;
};

// Random h and w, labels in [0, v) with every fifth row ignored; the count is the labels kept.
Problem make_problem(int64_t n, int64_t d, int64_t v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  Problem p{n, d, v, {}, {}, {}, 0};
  p.h.resize(size_t(n * d));
  p.w.resize(size_t(v * d));
  for (double& x : p.h) x = dist(rng);
  for (double& x : p.w) x = dist(rng);
  for (int64_t r = 0; r < n; ++r) {
    const bool ignored = r % 5 == 3;
    p.labels.push_back(ignored ? -100 : int32_t(rng() % uint64_t(v)));
    p.count += ignored ? 0 : 1;
  }
  return p;
}

template <typename T>
std::vector<Tensor> inputs_of(const Problem& p) {
  return {Tensor::from_vector(std::vector<T>(p.h.begin(), p.h.end()), Shape{p.n, p.d}),
          Tensor::from_vector(std::vector<T>(p.w.begin(), p.w.end()), Shape{p.v, p.d}),
          Tensor::from_vector(p.labels, Shape{p.n}),
          Tensor::from_vector(std::vector<int64_t>{p.count}, Shape{1})};
}

// {loss, dh, dw} of the unfused graph for dloss = 1.
std::vector<ValueId> unfused(Builder& b, const std::vector<ValueId>& x) {
  ValueId logits = ops::linear(b, x[0], x[1]);
  ValueId loss = ops::cross_entropy(b, logits, x[2], x[3]);
  ValueId one = ops::fill(b, Shape{1}, b.dtype(x[0]), 1.0);
  ValueId g = ops::cross_entropy_backward(b, logits, x[2], x[3], one);
  return {loss, ops::matmul(b, g, x[1]), ops::matmul(b, g, x[0], true, false)};
}

template <typename T>
void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const std::vector<T> a = got.to_vector<T>(), e = want.to_vector<T>();
  ASSERT_EQ(a.size(), e.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i] - e[i])));
  EXPECT_LE(worst, tol) << what;
}

template <typename T>
void expect_fused_matches(int64_t n, int64_t chunk, double tol) {
  const uint64_t seed = testing::fresh_seed();
  const Problem p = make_problem(n, 8, 29, seed);
  auto fused =
      testing::run_forward(inputs_of<T>(p), [&](Builder& b, const std::vector<ValueId>& x) {
        ops::LinearCrossEntropy o =
            ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3], true, chunk);
        return std::vector<ValueId>{o.loss, o.dh, o.dw};
      });
  auto ref = testing::run_forward(inputs_of<T>(p), unfused);
  const std::string what = "N " + std::to_string(n) + " chunk " + std::to_string(chunk) + " seed " +
                           std::to_string(seed);
  expect_close<T>(fused[0], ref[0], tol, "loss, " + what);
  expect_close<T>(fused[1], ref[1], tol, "dh, " + what);
  expect_close<T>(fused[2], ref[2], tol, "dw, " + what);
}

TEST(OpsLinearCrossEntropy, MatchesUnfusedFloat64) {
  expect_fused_matches<double>(37, 8, 1e-13);     // 4 full chunks and a tail of 5
  expect_fused_matches<double>(37, 37, 1e-13);    // one chunk
  expect_fused_matches<double>(12, 1000, 1e-13);  // chunk_rows beyond N
  expect_fused_matches<double>(9, 1, 1e-13);      // one row per chunk
}

TEST(OpsLinearCrossEntropy, MatchesUnfusedFloat32) {
  expect_fused_matches<float>(53, 16, 2e-6);
  expect_fused_matches<float>(20, 2048, 2e-6);
}

TEST(OpsLinearCrossEntropy, IgnoredRowsGetZeroGradientAndNoLoss) {
  const Problem p = make_problem(10, 4, 7, testing::fresh_seed());
  auto out =
      testing::run_forward(inputs_of<double>(p), [](Builder& b, const std::vector<ValueId>& x) {
        ops::LinearCrossEntropy o = ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3], true, 3);
        return std::vector<ValueId>{o.dh};
      });
  const std::vector<double> dh = out[0].to_vector<double>();
  for (int64_t r = 0; r < p.n; ++r) {
    double norm = 0;
    for (int64_t k = 0; k < p.d; ++k) norm += std::abs(dh[size_t(r * p.d + k)]);
    if (p.labels[size_t(r)] == -100)
      EXPECT_EQ(norm, 0.0) << "ignored row " << r;
    else
      EXPECT_GT(norm, 0.0) << "row " << r;
  }
}

TEST(OpsLinearCrossEntropy, LossOnlyFormHasOneOutputAndTheSameLoss) {
  const Problem p = make_problem(23, 6, 11, testing::fresh_seed());
  auto build = [](bool grads) {
    return [grads](Builder& b, const std::vector<ValueId>& x) {
      ops::LinearCrossEntropy o = ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3], grads, 5);
      EXPECT_EQ(o.dh == kNoValue, !grads);
      EXPECT_EQ(b.graph().node(b.graph().value(o.loss).producer).outputs.size(), grads ? 3u : 1u);
      return std::vector<ValueId>{o.loss};
    };
  };
  auto a = testing::run_forward(inputs_of<double>(p), build(false));
  auto c = testing::run_forward(inputs_of<double>(p), build(true));
  EXPECT_EQ(a[0].to_vector<double>()[0], c[0].to_vector<double>()[0]);
}

MT_GRADCHECK_TEST(OpsLinearCrossEntropy, GradCheckHAndW, "linear_cross_entropy") {
  InputSpec h{Shape{7, 5}, DType::kF64, true, 0, -1.0, 1.0};
  InputSpec w{Shape{6, 5}, DType::kF64, true, 0, -1.0, 1.0};
  InputSpec labels{.shape = Shape{7},
                   .dtype = DType::kI32,
                   .differentiable = false,
                   .values = {4, -100, 0, 5, 2, -100, 1}};
  InputSpec count{.shape = Shape{1}, .dtype = DType::kI64, .differentiable = false, .values = {5}};
  // chunk_rows 3: two full chunks and a tail of one row; the loss scaled so dloss is not 1.
  expect_grad_ok(gradcheck({h, w, labels, count}, [](Builder& b, const std::vector<ValueId>& x) {
    ValueId loss = ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3], true, 3).loss;
    return std::vector<ValueId>{ops::scale(b, loss, 2.5)};
  }));
}

TEST(OpsLinearCrossEntropy, ScaleByAndItsAccumulatingForm) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{2, 3}, DType::kF64});
  ValueId s = b.input("s", {Shape{1}, DType::kF64});
  EXPECT_EQ(b.meta(ops::scale_by(b, x, s, DType::kF64)).shape, (Shape{2, 3}));
  auto out = testing::run_forward(
      {Tensor::from_vector(std::vector<double>{1, 2, 3, -4, 5, 6}, Shape{2, 3}),
       Tensor::from_vector(std::vector<double>{-0.5}, Shape{1})},
      [](Builder& b, const std::vector<ValueId>& in) {
        return std::vector<ValueId>{ops::scale_by(b, in[0], in[1], DType::kF64)};
      });
  EXPECT_EQ(out[0].to_vector<double>(), (std::vector<double>{-0.5, -1, -1.5, 2, -2.5, -3}));
  // A bf16 weight's gradient into its float32 sink: fuse_grad_matmul folds scale_by into the sink.
  Graph g2;
  Builder b2(g2);
  ValueId dw = b2.input("dw", {Shape{4, 2}, DType::kF32});
  ValueId dloss = b2.input("dloss", {Shape{1}, DType::kF32});
  ValueId sink = b2.persistent("grad", {Shape{4, 2}, DType::kF32}, ValueRole::kState);
  ops::accumulate(b2, sink, ops::scale_by(b2, dw, dloss, DType::kBF16));
  EXPECT_EQ(fuse_grad_matmul(g2), 1);
  int found = 0;
  for (NodeId i = 0; i < g2.num_nodes(); ++i)
    if (!g2.node(i).dead && g2.node(i).op == ops::kScaleByAccumulateOp) {
      ++found;
      EXPECT_EQ(g2.node(i).inputs, (std::vector<ValueId>{sink, dw, dloss}));
    }
  EXPECT_EQ(found, 1);
}

TEST(OpsLinearCrossEntropy, BadShapesAndLabels) {
  Graph g;
  Builder b(g);
  ValueId h = b.input("h", {Shape{8, 4}, DType::kF32});
  ValueId w = b.input("w", {Shape{10, 4}, DType::kF32});
  ValueId w5 = b.input("w5", {Shape{10, 5}, DType::kF32});
  ValueId w64 = b.input("w64", {Shape{10, 4}, DType::kF64});
  ValueId labels = b.input("labels", {Shape{8}, DType::kI32});
  ValueId labels6 = b.input("labels6", {Shape{6}, DType::kI32});
  ValueId count = b.input("count", {Shape{1}, DType::kI64});
  auto expect_msg = [&](ValueId wi, ValueId li, int64_t chunk, const std::string& want) {
    try {
      ops::linear_cross_entropy(b, h, wi, li, count, true, chunk);
      FAIL() << "expected an error: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_msg(w5, labels, 16, "differ in the inner dimension D");
  expect_msg(w64, labels, 16, "must share a floating dtype, found float32 and float64");
  expect_msg(w, labels6, 16, "labels must be int32 [8] (one per row of h), found int32 [6]");
  expect_msg(w, labels, 0, "chunk_rows must be positive, found 0");

  Problem p = make_problem(4, 3, 5, testing::fresh_seed());
  p.labels = {0, 7, 1, 2};
  try {
    testing::run_forward(inputs_of<double>(p), [](Builder& b, const std::vector<ValueId>& x) {
      return std::vector<ValueId>{ops::linear_cross_entropy(b, x[0], x[1], x[2], x[3]).loss};
    });
    FAIL() << "expected a value error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue) << e.what();
    EXPECT_NE(std::string(e.what()).find("row 1 has label 7"), std::string::npos) << e.what();
  }
}

// [model] output_loss_chunk_rows reaches the fused op of every loss (main and MTP depth), and
// its default is the op's.
TEST(OpsLinearCrossEntropy, ChunkRowsComeFromTheModelSection) {
  for (const auto& [overrides, want] : std::vector<std::pair<std::vector<std::string>, int64_t>>{
           {{"--model.mtp_layers", "1"}, ops::kDefaultChunkRows},
           {{"--model.mtp_layers", "1", "--model.output_loss_chunk_rows", "96"}, 96}}) {
    const auto built = step_graph_of("deepseek_v3_debug.toml", overrides);
    int fused = 0;
    for (const Node& n : built->sg->graph.nodes()) {
      if (n.dead || n.op != ops::kLinearCrossEntropyOp) continue;
      ++fused;
      EXPECT_EQ(n.attrs.i("chunk_rows"), want) << n.scope;
    }
    EXPECT_EQ(fused, 2) << "the main loss and one MTP depth";
  }
}

}  // namespace
}  // namespace meshtrain
