// `meshtrain plan`: builds the step graph of one rank of a layout (no processes, no memory
// allocated) and reports parameter counts, FLOPs per token and the planned memory of that rank;
// with dump_graph (or [job] dump_graph) also the scheduled step and optimizer graphs.
#pragma once

#include <string>

#include "meshtrain/train/job_config.h"

namespace meshtrain {

// world_size 0: the smallest world the [parallelism] degrees fit (expert_parallel_degree 8 with
// the other degrees at 1 needs 8 ranks).
// The cost model's inputs (train/cost_model.h): a throughput table file ("" = the shipped
// defaults of the device) and link overrides (<= 0 = the device's default).
struct PlanCostOptions {
  std::string table;
  int ranks_per_node = 0;
  double intra_gbps = 0, intra_latency_us = 0, inter_gbps = 0, inter_latency_us = 0;
};
std::string plan_report(const JobConfig& cfg, int world_size, int rank, bool dump_graph = false,
                        const PlanCostOptions& cost = {});
int smallest_world(const JobConfig& cfg);

}  // namespace meshtrain
