// Token embedding lookup: ids [...] int32 index the rows of weight [V, D]. The gradient flows to
// the weight only, through a scatter-add that visits tokens in index order (deterministic).
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// weight[ids] -> [..., D] in weight's dtype.
ValueId embedding(Builder& b, ValueId ids, ValueId weight);
// dweight [V, D]: row v is the sum of dy over the tokens whose id is v (zero for unused rows).
ValueId embedding_backward(Builder& b, ValueId ids, ValueId dy, int64_t num_embeddings);

}  // namespace meshtrain::ops
