// Building blocks both model families share: the scoped parameter helper, the SwiGLU
// feed-forward (torchtitan's FeedForward) and the output head's loss. Rule: a block emits its
// parameters and ops in one fixed order, so every model that uses it builds the same graph it built
// with its own copy.
#pragma once

#include <string>

#include "meshtrain/ir/builder.h"
#include "meshtrain/model/model.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

// The parameter `<current scope>.<local>` (e.g. "layers.3.attention" + "wq.weight"), as the plan
// places it for this rank.
ValueId scoped_param(Builder& b, ParallelPlan& plan, const std::string& local, const Shape& shape,
                     const InitSpec& init, ParamOptions options = {});

// w2 · (silu(w1 · x) ⊙ (w3 · x)) on x [tokens, dim], with w1, w3 [hidden, dim] and w2 [dim, hidden]
// (nn.Linear layouts): the SwiGLU feed-forward without any parallel plan.
ValueId swiglu_mlp(Builder& b, ValueId x, ValueId w1, ValueId w2, ValueId w3);

// A dense SwiGLU feed-forward block in scope "feed_forward": declares w1.weight and w3.weight
// (column-parallel) and w2.weight (row-parallel), w1 at trunc_normal(0.02) and w2 / w3 at the
// layer's depth-scaled `init_std`; takes the residual stream's token shard x [T/tp, dim] and
// returns its output on the same shard (tp_enter before w1/w3, tp_exit after w2).
ValueId feed_forward(Builder& b, ParallelPlan& plan, ValueId x, int64_t dim, int64_t hidden,
                     double init_std);

// The token-mean cross entropy of the logits h · woutᵀ (h [tokens, dim] of this rank's token
// shard, wout [vocab, dim], labels [tokens]), divided by `count`: with in.fused_output_loss one
// linear_cross_entropy node (its gradients computed in the same pass unless !in.loss_grads), else
// ops::linear then ops::cross_entropy. The head is replicated over tp (the residual stream is
// token-sharded), so every parallel layout takes the fused form.
ValueId output_loss(Builder& b, ValueId h, ValueId wout, ValueId labels, ValueId count,
                    const ModelInputs& in);

}  // namespace meshtrain
