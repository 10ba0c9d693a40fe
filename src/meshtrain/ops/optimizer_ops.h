// Ops of the optimizer graph: squared norms for gradient clipping and the fused AdamW update over
// a flat group of parameters (clip, decoupled weight decay, moments, bias correction, the
// gradient reset for the next step and the compute copy of the updated weights, in one pass).
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// Σ x² over all elements, accumulated and returned in float64 ([1]).
ValueId sum_squares(Builder& b, ValueId x);

struct AdamWParams {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double max_norm = 1.0;  // <= 0: no clipping
  // Zero the gradient after the update, for the next step's accumulation. false when every
  // step's gradients are written outright (one micro-batch: accumulate with overwrite).
  bool reset_grad = true;
};

// In place on param, exp_avg, exp_avg_sq; sets grad to zero afterwards (unless !reset_grad).
// total_norm_sq [1] f64 is the global squared gradient norm (on the device); the learning rate and
// the 1-based step are host scalars (graph slots) read at launch. compute (optional, param's
// shape, another float dtype): the compute copy, written in the same pass with cast(updated
// param) (the cast op's conversion); a skipped step (non-finite norm) leaves it as it was.
// `range` (elements [begin, begin + count) of the flat buffers; count -1: to the end) updates one
// slice only: the optimizer splits a group into slices so that the next step can start on the
// weights already updated (optim/optimizer.h). Each element's arithmetic is the same either way.
struct ElementRange {
  int64_t begin = 0, count = -1;
};
void adamw_update(Builder& b, ValueId param, ValueId grad, ValueId exp_avg, ValueId exp_avg_sq,
                  ValueId total_norm_sq, int lr_slot, int step_slot, const AdamWParams& p,
                  ValueId compute = kNoValue, ElementRange range = {});
// The slice an adamw_update node's attrs name, resolved against its flat buffers' `numel`.
ElementRange adamw_range(const Attrs& attrs, int64_t numel);

// torchtitan / torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace meshtrain::ops
