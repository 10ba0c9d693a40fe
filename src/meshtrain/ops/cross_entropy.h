// Token-mean cross entropy: sum over rows whose label is not ignore_index of
// (logsumexp(row) - row[label]), divided by token_count[0]. The count is a tensor, not an
// attribute, because it is the global count over data-parallel ranks and micro-batches, known
// only at run time; kernels read it on the device.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// logits [N, V] float, labels [N] int32, token_count [1] int64 -> loss [1] in logits' dtype
// (float32 for bfloat16 logits).
ValueId cross_entropy(Builder& b, ValueId logits, ValueId labels, ValueId token_count,
                      int64_t ignore_index = -100);
// dlogits = (softmax(logits) - onehot(label)) * dloss / count; zero rows for ignored labels.
ValueId cross_entropy_backward(Builder& b, ValueId logits, ValueId labels, ValueId token_count,
                               ValueId dloss, int64_t ignore_index = -100);

}  // namespace meshtrain::ops
