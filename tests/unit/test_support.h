// Shared helpers for tests that run the trainer in-process: one MPI runtime per test process
// and small job configs.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/comm/bootstrap.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain::testing {

// The process's Runtime (MPI singleton mode when not under mpirun), created on first use.
Runtime& test_runtime();

// A tiny llama3 job on the fortunes corpus: cpu, float32, seq 32, batch 2, no file output
// unless `dump_folder` is given. Extra overrides use the command-line syntax.
JobConfig tiny_job(const std::vector<std::string>& overrides = {});

}  // namespace meshtrain::testing
