// Stream assignment: every collective node runs on the stream of its mesh group (one stream per
// communication dimension, so an FSDP gather never queues behind a TP reduce-scatter); all other
// nodes run on the compute stream 0. The executor orders streams with events from the data
// dependencies and from arena reuse.
#pragma once

#include <map>

#include "meshtrain/core/mesh_group.h"
#include "meshtrain/ir/ir.h"

namespace meshtrain {

// Returns the stream index of each group used (1-based; compute is 0).
std::map<MeshGroup, int> assign_streams(Graph& graph);

}  // namespace meshtrain
