// Rotary position embedding on interleaved pairs (x[..., 2i], x[..., 2i+1]) — the convention of
// torchtitan's llama3 and deepseek_v3 (a complex multiply of adjacent pairs by e^{i t f_i}).
// Frequencies (with llama3 or YaRN scaling) are computed in float64 and stored as a
// [seq_len, rot_dim/2, 2] table of (cos, sin); rope() applies it to [B, S, H, rot_dim].
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

struct RopeConfig {
  std::string scaling = "none";  // "none" | "llama3" | "yarn"
  double theta = 10000.0;
  // llama3: scale_factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
  double scale_factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // yarn (DeepSeek-V3): rope_factor, beta_fast, beta_slow, original_seq_len
  double rope_factor = 40.0, beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_seq_len = 4096;
  // yarn only: whether the frequency correction is applied. Unset means torchtitan's rule (apply
  // only when the table's seq_len > original_seq_len); the model may force either way.
  std::optional<bool> yarn_apply;
};

// Throws ConfigError naming the field when the config cannot produce a table.
void validate_rope_config(const RopeConfig& cfg, int64_t rot_dim);
// Whether rope_table(seq_len, ...) applies the YaRN correction for this config.
bool yarn_applies(const RopeConfig& cfg, int64_t seq_len);
// The rot_dim/2 frequencies f_i (radians per position) after scaling, in float64.
std::vector<double> rope_frequencies(const RopeConfig& cfg, int64_t rot_dim, int64_t seq_len);
// The config a rope_table node was built with (kernels read it back from the attributes).
RopeConfig rope_config_from_attrs(const Attrs& attrs);

// -> [seq_len, rot_dim/2, 2] holding (cos(t f_i), sin(t f_i)); no inputs.
ValueId rope_table(Builder& b, int64_t seq_len, int64_t rot_dim, const RopeConfig& cfg,
                   DType dtype);
// x [B, S, H, D], table [>= S, rot_dim/2, 2] (rows 0..S-1 are used) -> x with its columns
// [start, start + rot_dim) rotated and the others copied (start even; D = rot_dim when start is
// 0 and nothing else is kept). MLA rotates the tail of each q head in place this way instead of
// slicing it out and concatenating it back. `inverse` rotates by -angle; it is the backward (the
// rotation is orthogonal). The table gets no gradient.
ValueId rope(Builder& b, ValueId x, ValueId table, bool inverse = false, int64_t start = 0);

// YaRN attention-scale correction: 0.1 * mscale * ln(factor) + 1, and 1 when factor <= 1.
double yarn_mscale(double rope_factor, double mscale);

}  // namespace meshtrain::ops
