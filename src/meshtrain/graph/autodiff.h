// Reverse-mode autodiff over the graph: appends the backward nodes that each op's backward rule
// emits, seeded with d(loss)/d(loss) = 1, accumulating fan-in with `add`. Collectives are ordinary
// ops here: the gradient of all_gather is reduce_scatter because that is all_gather's rule.
#pragma once

#include <unordered_map>
#include <vector>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

struct GradientMap {
  // wrt value -> its gradient value (kNoValue when the loss does not depend on it)
  std::unordered_map<ValueId, ValueId> grads;
  ValueId grad_of(ValueId v) const {
    auto it = grads.find(v);
    return it == grads.end() ? kNoValue : it->second;
  }
};

// Differentiates the scalar `loss` with respect to `wrt`. New nodes have phase kBackward and
// the scope of the forward node they differentiate.
GradientMap differentiate(Graph& graph, ValueId loss, const std::vector<ValueId>& wrt);

// Marks nodes dead whose outputs nobody reads, unless they have side effects or produce graph
// outputs. Returns how many nodes it removed.
int eliminate_dead_nodes(Graph& graph);

}  // namespace meshtrain
