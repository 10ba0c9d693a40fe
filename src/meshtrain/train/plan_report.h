// `meshtrain plan`: builds the step graph of one rank of a layout (no processes, no memory
// allocated) and reports parameter counts, FLOPs per token and the planned memory of that rank.
#pragma once

#include <string>

#include "meshtrain/train/job_config.h"

namespace meshtrain {

std::string plan_report(const JobConfig& cfg, int world_size, int rank);

}  // namespace meshtrain
