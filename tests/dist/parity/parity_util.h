// Shared by the parity and checkpoint tests: the harness's job defaults (tiny llama3, seq 32,
// seed 3; runs of logged steps are common/tiny_job.h's), and the final-parameter comparison (rank 0
// of `comm` holds a 1-rank reference, broadcasts each global tensor, every rank checks its shard;
// padding zero).
#pragma once

#include <string>
#include <vector>

#include "common/tiny_job.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::testing {

// The tiny job (common/tiny_job.h) with `steps` steps, seed 3, warmup 3 and dump folder
// /tmp/meshtrain_parity, then each list of overrides in order.
JobConfig harness_job(int steps, const std::vector<std::vector<std::string>>& overrides);

double rel(double a, double b);  // |a - b| / |b|

struct ParamDiff {
  // Weights and other state: max |x - ref| / (1 + |ref|) over this rank's elements (1 for bad
  // padding).
  double worst = 0;
  std::string where;  // "name[flat index]" of the worst element (flat -1: padding)
  // The load balancing's routing counters (token counts per expert): max |x - ref| / the
  // counter's total, the share of the layer's routed tokens that went to another expert.
  double routing = 0;
  std::string routing_where;
};

// `ref` is read on rank 0 of comm only (may be null elsewhere); its masters must be whole.
ParamDiff compare_params(const Trainer& got, const Trainer* ref, Communicator& comm, Backend& host);

}  // namespace meshtrain::testing
