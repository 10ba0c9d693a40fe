// The MTP modules (see mtp.h). Rule: every module is a block (its nodes carry its block index),
// and it reads the shared embedding and head through the values the main model already holds,
// so FSDP gathers, TP and EP treat it exactly as a block of the main stack.
#include "meshtrain/model/mtp.h"

#include "meshtrain/model/layers.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/embedding.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/rmsnorm.h"
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain {

ValueId roll_rows_left(Builder& b, ValueId x, int64_t k) {
  const int64_t S = b.shape(x)[1];
  MT_CHECK_T(ShapeError, k > 0 && k < S, "roll_rows_left: shift {} must be in [1, {})", k, S);
  return ops::concat(b, {ops::slice(b, x, 1, k, S - k), ops::slice(b, x, 1, 0, k)}, 1);
}

ValueId shift_labels_left(Builder& b, ValueId labels, int64_t k, int64_t ignore_index) {
  const Shape s = b.shape(labels);  // a copy: adding nodes may move the graph's values
  MT_CHECK_T(ShapeError, k > 0 && k < s[1], "shift_labels_left: shift {} must be in [1, {})", k,
             s[1]);
  ValueId tail = ops::fill(b, Shape{s[0], k}, b.dtype(labels), double(ignore_index));
  return ops::concat(b, {ops::slice(b, labels, 1, k, s[1] - k), tail}, 1);
}

int64_t mtp_valid_targets(int64_t targets, int64_t seq_len, int depth) {
  MT_CHECK(seq_len > 0 && targets % seq_len == 0 && depth >= 1 && depth < seq_len,
           "mtp_valid_targets: {} targets in rows of {}, depth {}", targets, seq_len, depth);
  return targets / seq_len * (seq_len - depth);
}

namespace {

void check_inputs(Builder& b, const DeepSeekV3Args& a, const ModelInputs& in, ValueId main_loss) {
  const int D = a.mtp_layers;
  MT_CHECK_T(ConfigError, D < in.seq_len,
             "[model] mtp_layers = {} needs seq_len > {}: depth k predicts the token k + 1 ahead "
             "inside a row of seq_len {} tokens",
             D, D, in.seq_len);
  MT_CHECK_T(ShapeError, in.mtp_token_count != kNoValue && in.mtp_loss_weight != kNoValue,
             "deepseek_v3 with mtp_layers = {}: ModelInputs needs mtp_token_count and "
             "mtp_loss_weight (the trainer's step graph creates them)",
             D);
  const TensorMeta& count = b.meta(in.mtp_token_count);
  MT_CHECK_T(ShapeError, count.shape == Shape{D} && count.dtype == DType::kI64,
             "mtp_token_count must be int64 [{}] (one count per depth), found {} {}", D,
             count.dtype, count.shape);
  const TensorMeta& w = b.meta(in.mtp_loss_weight);
  MT_CHECK_T(ShapeError, w.shape == Shape{1} && w.dtype == b.dtype(main_loss),
             "mtp_loss_weight must be {} [1] (the loss dtype), found {} {}", b.dtype(main_loss),
             w.dtype, w.shape);
}

}  // namespace

ModelLoss add_mtp_modules(Builder& b, ParallelPlan& plan, const DeepSeekV3Args& a,
                          const ModelInputs& in, const MtpShared& shared, ValueId main_loss,
                          const MtpBlockFn& block) {
  const int D = a.mtp_layers;
  ModelLoss out{main_loss, main_loss, {}};
  if (D == 0) return out;
  check_inputs(b, a, in, main_loss);
  const int64_t T = in.batch * in.seq_len, dim = a.dim;
  ValueId h = shared.hidden;
  for (int k = 1; k <= D; ++k) {
    auto s = b.block(a.mtp_block(k));
    // Shifted inside each row before the sequence-parallel split, so every tp rank's shard
    // holds the same positions as its shard of the main stack.
    ValueId tokens =
        plan.shard_tokens(b, ops::reshape(b, roll_rows_left(b, in.tokens, k), Shape{T}));
    ValueId labels =
        plan.shard_tokens(b, ops::reshape(b, shift_labels_left(b, in.labels, k), Shape{T}));
    ValueId e;
    {
      auto es = b.scope("embed");
      e = ops::embedding(b, tokens, shared.embedding);
    }
    // The release's order: the embedding half first, the hidden half second.
    ValueId en = scoped_param(b, plan, "enorm.weight", {dim}, InitSpec::ones());
    ValueId hn = scoped_param(b, plan, "hnorm.weight", {dim}, InitSpec::ones());
    ValueId proj =
        scoped_param(b, plan, "eh_proj.weight", {dim, 2 * dim}, InitSpec::trunc_normal(0.02));
    ValueId x = ops::concat(
        b, {ops::rmsnorm(b, e, en, a.norm_eps), ops::rmsnorm(b, h, hn, a.norm_eps)}, -1);
    h = block(a.mtp_block(k), ops::linear(b, x, proj));
    ValueId fw = scoped_param(b, plan, "final_norm.weight", {dim}, InitSpec::ones());
    ValueId y = ops::rmsnorm(b, h, fw, a.norm_eps);
    auto hs = b.scope("head");
    ValueId count = D == 1 ? in.mtp_token_count : ops::slice(b, in.mtp_token_count, 0, k - 1, 1);
    out.mtp.push_back(output_loss(b, y, shared.output, labels, count, in));
  }
  auto s = b.scope("mtp_loss");
  ValueId sum = out.mtp[0];
  for (int k = 1; k < D; ++k) sum = ops::add(b, sum, out.mtp[size_t(k)]);
  ValueId mean = D > 1 ? ops::scale(b, sum, 1.0 / double(D)) : sum;
  out.total = ops::add(b, main_loss, ops::mul(b, in.mtp_loss_weight, mean));
  return out;
}

}  // namespace meshtrain
