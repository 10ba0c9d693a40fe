// `meshtrain plan`: builds the step graph of one rank of a layout (no processes, no memory
// allocated) and reports parameter counts, FLOPs per token and the planned memory of that rank;
// with dump_graph (or [job] dump_graph) also the scheduled step and optimizer graphs.
#pragma once

#include <string>

#include "meshtrain/train/job_config.h"

namespace meshtrain {

// world_size 0: the smallest world the [parallelism] degrees fit (expert_parallel_degree 8 with
// the other degrees at 1 needs 8 ranks).
std::string plan_report(const JobConfig& cfg, int world_size, int rank, bool dump_graph = false);
int smallest_world(const JobConfig& cfg);

}  // namespace meshtrain
