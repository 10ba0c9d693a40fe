// rope_table / rope: the frequency formulas (matching torchtitan's llama3 apply_scaling and
// deepseek_v3 precompute_freqs_cis, evaluated in float64), shape inference and the backward.
#include "meshtrain/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace meshtrain::ops {
namespace {

constexpr double kPi = std::numbers::pi;

// llama3: keep high frequencies, divide low ones by scale_factor, interpolate in between.
double llama3_scale(double f, const RopeConfig& c) {
  const double orig = double(c.original_max_position_embeddings);
  const double low_wavelen = orig / c.low_freq_factor;
  const double high_wavelen = orig / c.high_freq_factor;
  const double wavelen = 2 * kPi / f;
  if (wavelen < high_wavelen) return f;
  if (wavelen > low_wavelen) return f / c.scale_factor;
  const double smooth =
      (orig / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  return (1 - smooth) * f / c.scale_factor + smooth * f;
}

// YaRN: the dim index (in units of the full rotary dim) at which a frequency completes
// `rotations` turns over the original context.
double correction_dim(double rotations, int64_t dim, double base, int64_t orig_len) {
  return double(dim) * std::log(double(orig_len) / (rotations * 2 * kPi)) / (2 * std::log(base));
}

}  // namespace

void validate_rope_config(const RopeConfig& c, int64_t rot_dim) {
  MT_CHECK_T(ConfigError, c.scaling == "none" || c.scaling == "llama3" || c.scaling == "yarn",
             "rope scaling must be one of none, llama3, yarn; found '{}'", c.scaling);
  MT_CHECK_T(ConfigError, rot_dim > 0 && rot_dim % 2 == 0,
             "rope rotary dim must be positive and even, found {}", rot_dim);
  MT_CHECK_T(ConfigError, c.theta > 1, "rope theta must be > 1, found {}", c.theta);
  if (c.scaling == "llama3") {
    MT_CHECK_T(ConfigError, c.scale_factor > 0, "rope llama3 scale_factor must be > 0, found {}",
               c.scale_factor);
    MT_CHECK_T(ConfigError, c.low_freq_factor > 0 && c.high_freq_factor > c.low_freq_factor,
               "rope llama3 needs 0 < low_freq_factor < high_freq_factor, found {} and {}",
               c.low_freq_factor, c.high_freq_factor);
    MT_CHECK_T(ConfigError, c.original_max_position_embeddings > 0,
               "rope llama3 original_max_position_embeddings must be > 0, found {}",
               c.original_max_position_embeddings);
  }
  if (c.scaling == "yarn") {
    MT_CHECK_T(ConfigError, c.rope_factor > 0, "rope yarn rope_factor must be > 0, found {}",
               c.rope_factor);
    MT_CHECK_T(ConfigError, c.beta_fast > 0 && c.beta_slow > 0,
               "rope yarn beta_fast and beta_slow must be > 0, found {} and {}", c.beta_fast,
               c.beta_slow);
    MT_CHECK_T(ConfigError, c.original_seq_len > 0,
               "rope yarn original_seq_len must be > 0, found {}", c.original_seq_len);
  }
}

bool yarn_applies(const RopeConfig& c, int64_t seq_len) {
  if (c.scaling != "yarn") return false;
  return c.yarn_apply.value_or(seq_len > c.original_seq_len);
}

std::vector<double> rope_frequencies(const RopeConfig& c, int64_t rot_dim, int64_t seq_len) {
  validate_rope_config(c, rot_dim);
  const int64_t half = rot_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[size_t(i)] = 1.0 / std::pow(c.theta, double(2 * i) / double(rot_dim));
  if (c.scaling == "llama3") {
    for (double& x : f) x = llama3_scale(x, c);
  } else if (yarn_applies(c, seq_len)) {
    // torchtitan: low = floor(dim at beta_fast), high = ceil(dim at beta_slow), clamped to
    // [0, dim - 1]; the ramp runs over the dim/2 frequency indices between them.
    double low = std::floor(correction_dim(c.beta_fast, rot_dim, c.theta, c.original_seq_len));
    double high = std::ceil(correction_dim(c.beta_slow, rot_dim, c.theta, c.original_seq_len));
    low = std::max(low, 0.0);
    high = std::min(high, double(rot_dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double smooth = 1 - ramp;
      double& x = f[size_t(i)];
      x = x / c.rope_factor * (1 - smooth) + x * smooth;
    }
  }
  return f;
}

RopeConfig rope_config_from_attrs(const Attrs& a) {
  RopeConfig c;
  c.scaling = a.s("scaling");
  c.theta = a.f("theta");
  c.scale_factor = a.f("scale_factor");
  c.low_freq_factor = a.f("low_freq_factor");
  c.high_freq_factor = a.f("high_freq_factor");
  c.original_max_position_embeddings = a.i("original_max_position_embeddings");
  c.rope_factor = a.f("rope_factor");
  c.beta_fast = a.f("beta_fast");
  c.beta_slow = a.f("beta_slow");
  c.original_seq_len = a.i("original_seq_len");
  c.yarn_apply = a.b("yarn_apply");
  return c;
}

double yarn_mscale(double rope_factor, double mscale) {
  if (rope_factor <= 1) return 1.0;
  return 0.1 * mscale * std::log(rope_factor) + 1.0;
}

ValueId rope_table(Builder& b, int64_t seq_len, int64_t rot_dim, const RopeConfig& c, DType dtype) {
  validate_rope_config(c, rot_dim);
  MT_CHECK_T(ConfigError, seq_len > 0, "rope table seq_len must be positive, found {}", seq_len);
  // The node records whether YaRN applies, resolved here, so the graph dump says what it does.
  return b.op1("rope_table", {},
               {{"seq_len", seq_len},
                {"rot_dim", rot_dim},
                {"dtype", int64_t(dtype)},
                {"scaling", c.scaling},
                {"theta", c.theta},
                {"scale_factor", c.scale_factor},
                {"low_freq_factor", c.low_freq_factor},
                {"high_freq_factor", c.high_freq_factor},
                {"original_max_position_embeddings", c.original_max_position_embeddings},
                {"rope_factor", c.rope_factor},
                {"beta_fast", c.beta_fast},
                {"beta_slow", c.beta_slow},
                {"original_seq_len", c.original_seq_len},
                {"yarn_apply", int64_t(yarn_applies(c, seq_len))}});
}

ValueId rope(Builder& b, ValueId x, ValueId table, bool inverse, int64_t start) {
  Attrs a{{"inverse", int64_t(inverse)}};
  if (start != 0) a.set("start", start);
  return b.op1("rope", {x, table}, std::move(a));
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op(
      {.name = "rope_table", .infer = [](const std::vector<TensorMeta>& in, const Attrs& a) {
         MT_CHECK_T(ShapeError, in.empty(), "rope_table takes no inputs, found {}", in.size());
         int64_t s = a.i("seq_len"), d = a.i("rot_dim");
         MT_CHECK_T(ShapeError, s > 0 && d > 0 && d % 2 == 0,
                    "rope_table needs seq_len > 0 and an even rot_dim > 0, found {} and {}", s, d);
         DType dt = DType(a.i("dtype"));
         MT_CHECK_T(ShapeError, is_floating(dt), "rope_table dtype must be floating, found {}", dt);
         return std::vector<TensorMeta>{{Shape{s, d / 2, 2}, dt}};
       }});
  r.add_op(
      {.name = "rope",
       .infer =
           [](const std::vector<TensorMeta>& in, const Attrs& a) {
             MT_CHECK_T(ShapeError, in.size() == 2, "rope takes (x, table), found {} inputs",
                        in.size());
             const TensorMeta& x = in[0];
             const TensorMeta& t = in[1];
             MT_CHECK_T(ShapeError, x.shape.rank() == 4,
                        "rope: x must be [B, S, H, rot_dim], found {}", x.shape);
             MT_CHECK_T(ShapeError, t.shape.rank() == 3 && t.shape[2] == 2,
                        "rope: table must be [S, rot_dim/2, 2], found {}", t.shape);
             const int64_t start = a.i("start", 0);
             MT_CHECK_T(ShapeError, start >= 0 && start % 2 == 0,
                        "rope: the rotated window must start at an even column >= 0, found {}",
                        start);
             MT_CHECK_T(ShapeError, x.shape[3] == start + 2 * t.shape[1],
                        "rope: x last dim {} must be the window start {} plus twice the table's "
                        "frequency count {} (table {})",
                        x.shape[3], start, t.shape[1], t.shape);
             MT_CHECK_T(ShapeError, t.shape[0] >= x.shape[1],
                        "rope: table covers {} positions, x has sequence length {}", t.shape[0],
                        x.shape[1]);
             // A bfloat16 x may use a float32 table (the table keeps full precision; the
             // rotation is computed in float32 and rounded once).
             MT_CHECK_T(ShapeError,
                        is_floating(x.dtype) && (x.dtype == t.dtype || (x.dtype == DType::kBF16 &&
                                                                        t.dtype == DType::kF32)),
                        "rope: x and table must share a floating dtype (or x bfloat16 with a "
                        "float32 table), found {} and {}",
                        x.dtype, t.dtype);
             return std::vector<TensorMeta>{x};
           },
       .backward =
           [](GradContext& c) {
             bool inverse = c.attrs().b("inverse");
             return std::vector<ValueId>{
                 rope(c.b, c.grad_out(0), c.in(1), !inverse, c.attrs().i("start", 0)), kNoValue};
           }});
}

}  // namespace meshtrain::ops
