// Stream assignment: every collective node runs on the stream of its mesh group (one stream per
// communication dimension, so an FSDP gather never queues behind a TP reduce-scatter); all other
// nodes run on the compute stream 0. The executor orders streams with events from the data
// dependencies and from arena reuse.
#pragma once

#include <map>
#include <string>

#include "meshtrain/ir/ir.h"

namespace meshtrain {

// Returns stream index per group name (1-based; compute is 0), in first-use order.
std::map<std::string, int> assign_streams(Graph& graph);

}  // namespace meshtrain
