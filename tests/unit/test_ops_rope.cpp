// rope_table and rope: table values for none / llama3 / yarn against a straightforward float64
// computation written here (plus hand-derived band checks), torchtitan's YaRN condition and its
// override, rope against a complex multiply, inverse rotation, gradcheck, and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "gradcheck.h"
#include "meshtrain/ops/rope.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain {
namespace {
using ops::RopeConfig;
using testing::gradcheck;
using testing::InputSpec;
constexpr double kPi = std::numbers::pi;

using testing::expect_grad_ok;

// Reference frequencies, written the way torchtitan states them (two torch.where steps for
// llama3; find_correction_dim / find_correction_range / linear_ramp_factor for yarn).
std::vector<double> reference_freqs(const RopeConfig& c, int64_t dim, bool apply_yarn) {
  std::vector<double> f;
  for (int64_t k = 0; k < dim; k += 2) f.push_back(std::pow(c.theta, -double(k) / double(dim)));
  if (c.scaling == "llama3") {
    const double orig = double(c.original_max_position_embeddings);
    const double low_wl = orig / c.low_freq_factor, high_wl = orig / c.high_freq_factor;
    for (double& x : f) {
      const double wl = 2 * kPi / x;
      const double nf = wl > low_wl ? x / c.scale_factor : x;
      const double smooth =
          (orig / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      x = (wl >= high_wl && wl <= low_wl) ? (1 - smooth) * nf / c.scale_factor + smooth * nf : nf;
    }
  }
  if (c.scaling == "yarn" && apply_yarn) {
    auto corr = [&](double rot) {
      return dim * std::log(double(c.original_seq_len) / (rot * 2 * kPi)) / (2 * std::log(c.theta));
    };
    double lo = std::max(std::floor(corr(c.beta_fast)), 0.0);
    double hi = std::min(std::ceil(corr(c.beta_slow)), double(dim - 1));
    if (lo == hi) hi += 0.001;
    for (size_t i = 0; i < f.size(); ++i) {
      double ramp = std::min(1.0, std::max(0.0, (double(i) - lo) / (hi - lo)));
      double smooth = 1 - ramp;
      f[i] = f[i] / c.rope_factor * (1 - smooth) + f[i] * smooth;
    }
  }
  return f;
}

template <typename T>
std::vector<T> table_of(int64_t seq_len, int64_t dim, const RopeConfig& c) {
  auto out = testing::run_forward({}, [&](Builder& b, const std::vector<ValueId>&) {
    return std::vector<ValueId>{ops::rope_table(b, seq_len, dim, c, dtype_of<T>())};
  });
  EXPECT_EQ(out[0].shape(), (Shape{seq_len, dim / 2, 2}));
  return out[0].template to_vector<T>();
}

void expect_table(const std::vector<double>& got, const std::vector<double>& freqs, int64_t seq_len,
                  double tol, const std::string& what) {
  const int64_t half = int64_t(freqs.size());
  ASSERT_EQ(int64_t(got.size()), seq_len * half * 2) << what;
  double worst = 0;
  for (int64_t t = 0; t < seq_len; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double a = double(t) * freqs[size_t(i)];
      worst = std::max(worst, std::abs(got[size_t((t * half + i) * 2)] - std::cos(a)));
      worst = std::max(worst, std::abs(got[size_t((t * half + i) * 2 + 1)] - std::sin(a)));
    }
  EXPECT_LE(worst, tol) << what;
}

RopeConfig llama3_config() {
  RopeConfig c;
  c.scaling = "llama3";
  c.theta = 500000.0;
  return c;  // torchtitan's defaults: factor 8, low 1, high 4, original 8192
}

RopeConfig yarn_config() {
  RopeConfig c;
  c.scaling = "yarn";
  return c;  // DeepSeek-V3 defaults: factor 40, beta_fast 32, beta_slow 1, original 4096
}

TEST(OpsRope, TableNoScaling) {
  RopeConfig c;
  std::vector<double> got = table_of<double>(9, 16, c);
  expect_table(got, reference_freqs(c, 16, false), 9, 1e-15, "none");
  // Hand values: position 1, frequency 0 rotates by exactly 1 radian; position 0 by nothing.
  EXPECT_DOUBLE_EQ(got[size_t(1 * 8 * 2)], std::cos(1.0));
  EXPECT_DOUBLE_EQ(got[size_t(1 * 8 * 2 + 1)], std::sin(1.0));
  EXPECT_EQ(got[2], 1.0);
  EXPECT_EQ(got[3], 0.0);
}

TEST(OpsRope, TableLlama3CoversAllThreeBands) {
  RopeConfig c = llama3_config();
  const int64_t dim = 64;
  std::vector<double> base = reference_freqs(RopeConfig{.theta = c.theta}, dim, false);
  std::vector<double> scaled = ops::rope_frequencies(c, dim, 32);
  std::vector<double> ref = reference_freqs(c, dim, false);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NEAR(scaled[i], ref[i], 1e-14 * base[i]) << i;
    // base is pow(theta, -k/dim) here, 1/pow(theta, k/dim) in the op: equal to a few ulps.
    const double tol = 1e-14 * base[i];
    if (std::abs(scaled[i] - base[i]) <= tol)
      ++kept;
    else if (std::abs(scaled[i] - base[i] / 8) <= tol)
      ++divided;
    else if (scaled[i] < base[i] && scaled[i] > base[i] / 8)
      ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(kept + divided + blended, int(base.size()));
  expect_table(table_of<double>(32, dim, c), ref, 32, 1e-12, "llama3");
}

TEST(OpsRope, TableYarnForcedMatchesHandDerivedRamp) {
  RopeConfig c = yarn_config();
  c.yarn_apply = true;
  const int64_t dim = 64;
  // dim*ln(4096/(beta*2pi))/(2 ln 10000): 10.47 for beta 32 (floor 10), 22.5 for beta 1 (ceil 23).
  std::vector<double> f = ops::rope_frequencies(c, dim, 16);
  std::vector<double> base = reference_freqs(RopeConfig{}, dim, false);
  for (int i = 0; i <= 10; ++i) EXPECT_NEAR(f[size_t(i)], base[size_t(i)], 1e-15) << i;
  for (int i = 23; i < 32; ++i) EXPECT_NEAR(f[size_t(i)], base[size_t(i)] / 40, 1e-18) << i;
  const double ramp = 6.0 / 13.0;  // i = 16
  EXPECT_NEAR(f[16], base[16] * (1 - ramp) + base[16] / 40 * ramp, 1e-16);
  expect_table(table_of<double>(16, dim, c), reference_freqs(c, dim, true), 16, 1e-12, "yarn");
}

TEST(OpsRope, YarnAppliesOnlyBeyondOriginalSeqLenUnlessForced) {
  RopeConfig c = yarn_config();
  const int64_t dim = 16;
  EXPECT_FALSE(ops::yarn_applies(c, 4096));
  EXPECT_TRUE(ops::yarn_applies(c, 4097));
  // torchtitan's rule: a 4096-row table is unscaled, a 4097-row table is corrected.
  expect_table(table_of<double>(4096, dim, c), reference_freqs(c, dim, false), 4096, 1e-11,
               "yarn at original length");
  expect_table(table_of<double>(4097, dim, c), reference_freqs(c, dim, true), 4097, 1e-11,
               "yarn beyond original length");
  EXPECT_NE(reference_freqs(c, dim, true), reference_freqs(c, dim, false));
  // The model can override the rule either way.
  c.yarn_apply = false;
  EXPECT_FALSE(ops::yarn_applies(c, 5000));
  expect_table(table_of<double>(5000, dim, c), reference_freqs(c, dim, false), 5000, 1e-11,
               "yarn forced off");
  c.yarn_apply = true;
  expect_table(table_of<double>(8, dim, c), reference_freqs(c, dim, true), 8, 1e-14,
               "yarn forced on");
}

TEST(OpsRope, Float32TableMatchesFloat64) {
  RopeConfig yarn_on = yarn_config();
  yarn_on.yarn_apply = true;
  for (const RopeConfig& c : {RopeConfig{}, llama3_config(), yarn_on}) {
    std::vector<double> d = table_of<double>(64, 32, c);
    std::vector<float> f = table_of<float>(64, 32, c);
    for (size_t i = 0; i < d.size(); ++i) ASSERT_NEAR(double(f[i]), d[i], 1e-7) << c.scaling;
  }
}

TEST(OpsRope, YarnMscale) {
  EXPECT_DOUBLE_EQ(ops::yarn_mscale(40.0, 1.0), 0.1 * std::log(40.0) + 1.0);
  EXPECT_DOUBLE_EQ(ops::yarn_mscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1.0);
  EXPECT_EQ(ops::yarn_mscale(1.0, 1.0), 1.0);
  EXPECT_EQ(ops::yarn_mscale(0.5, 1.0), 1.0);
}

std::vector<double> random_values(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

TEST(OpsRope, RotatesAdjacentPairsAsComplexNumbers) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t B = 2, S = 3, H = 2, D = 8;
  // theta 500000, D 8: wavelengths 6.3, 167, 4443, 118143 -> kept, kept, blended, divided.
  RopeConfig c = llama3_config();
  std::vector<double> x = random_values(B * S * H * D, rng);
  auto out = testing::run_forward({Tensor::from_vector(x, Shape{B, S, H, D})},
                                  [&](Builder& b, const std::vector<ValueId>& in) {
                                    // A longer table: rows 0..S-1 are used.
                                    ValueId t = ops::rope_table(b, S + 2, D, c, DType::kF64);
                                    ValueId y = ops::rope(b, in[0], t);
                                    return std::vector<ValueId>{y, ops::rope(b, y, t, true)};
                                  });
  std::vector<double> freqs = reference_freqs(c, D, false);
  std::vector<double> y = out[0].to_vector<double>(), back = out[1].to_vector<double>();
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          size_t o = size_t(((bi * S + s) * H + h) * D + 2 * i);
          std::complex<double> z(x[o], x[o + 1]);
          std::complex<double> w = z * std::polar(1.0, double(s) * freqs[size_t(i)]);
          EXPECT_NEAR(y[o], w.real(), 1e-14) << "seed " << seed;
          EXPECT_NEAR(y[o + 1], w.imag(), 1e-14) << "seed " << seed;
          EXPECT_NEAR(back[o], x[o], 1e-14);
          EXPECT_NEAR(back[o + 1], x[o + 1], 1e-14);
        }
}

TEST(OpsRope, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const Shape s{2, 5, 3, 16};
  std::vector<double> x = random_values(s.numel(), rng);
  auto run = [&](DType dt, const Tensor& in) {
    return testing::run_forward({in}, [&](Builder& b, const std::vector<ValueId>& v) {
      RopeConfig c = yarn_config();
      c.yarn_apply = true;
      return std::vector<ValueId>{ops::rope(b, v[0], ops::rope_table(b, 5, 16, c, dt))};
    });
  };
  auto o64 = run(DType::kF64, Tensor::from_vector(x, s));
  auto o32 = run(DType::kF32, Tensor::from_vector(std::vector<float>(x.begin(), x.end()), s));
  std::vector<double> a = o64[0].to_vector<double>();
  std::vector<float> f = o32[0].to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(double(f[i]), a[i], 1e-6) << "seed " << seed;
}

MT_GRADCHECK_TEST(OpsRope, GradCheck, "rope") {
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    expect_grad_ok(gradcheck({{Shape{2, 4, 3, 8}}}, [&](Builder& b, const std::vector<ValueId>& x) {
      ValueId t = ops::rope_table(b, 4, 8, llama3_config(), DType::kF64);
      return std::vector<ValueId>{ops::rope(b, x[0], t, inverse)};
    }));
  }
}

// A window at `start`: the rotated columns equal rope of the sliced tail, the others are copied,
// and the gradient checks out.
TEST(OpsRope, WindowRotatesTheTailAndCopiesTheRest) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const Shape s{2, 4, 3, 14};  // 6 copied columns, 8 rotated
  std::vector<double> x = random_values(s.numel(), rng);
  auto out = testing::run_forward(
      {Tensor::from_vector(x, s)}, [&](Builder& b, const std::vector<ValueId>& in) {
        ValueId t = ops::rope_table(b, 4, 8, llama3_config(), DType::kF64);
        return std::vector<ValueId>{ops::rope(b, in[0], t, false, 6),
                                    ops::rope(b, ops::slice(b, in[0], -1, 6, 8), t)};
      });
  std::vector<double> y = out[0].to_vector<double>(), tail = out[1].to_vector<double>();
  for (int64_t r = 0; r < s.numel() / 14; ++r)
    for (int64_t j = 0; j < 14; ++j) {
      const double want = j < 6 ? x[size_t(r * 14 + j)] : tail[size_t(r * 8 + j - 6)];
      ASSERT_EQ(y[size_t(r * 14 + j)], want) << "row " << r << " col " << j << " seed " << seed;
    }
  for (bool inverse : {false, true})
    expect_grad_ok(gradcheck({{s}}, [&](Builder& b, const std::vector<ValueId>& v) {
      ValueId t = ops::rope_table(b, 4, 8, llama3_config(), DType::kF64);
      return std::vector<ValueId>{ops::rope(b, v[0], t, inverse, 6)};
    }));
}

TEST(OpsRope, BadInputs) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{2, 4, 3, 6}, DType::kF32});
  ValueId t = ops::rope_table(b, 4, 8, RopeConfig{}, DType::kF32);
  try {
    ops::rope(b, x, t);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "x last dim 6 must be the window start 0 plus twice the table's frequency count 4"),
        std::string::npos)
        << e.what();
  }
  ValueId long_x = b.input("long_x", {Shape{2, 9, 3, 8}, DType::kF32});
  try {
    ops::rope(b, long_x, t);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("table covers 4 positions, x has sequence length 9"),
              std::string::npos)
        << e.what();
  }
  RopeConfig bad;
  bad.scaling = "linear";
  try {
    ops::rope_table(b, 4, 8, bad, DType::kF32);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("found 'linear'"), std::string::npos) << e.what();
  }
  try {
    ops::rope_table(b, 4, 7, RopeConfig{}, DType::kF32);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("positive and even, found 7"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
