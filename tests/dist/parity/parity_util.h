// Shared by the parity and checkpoint tests: the harness's job defaults (tiny llama3, seq 32,
// seed 3), a run of logged steps, and the final-parameter comparison (rank 0 of `comm` holds a
// 1-rank reference, broadcasts each global tensor, every rank checks its shard; padding zero).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::testing {

// Harness defaults (cpu, tiny, seq 32, `steps` steps, seed 3, lr 3e-3, warmup 3, no jsonl, dump
// folder /tmp/meshtrain_parity), then each list of overrides in order.
JobConfig harness_job(int steps, const std::vector<std::vector<std::string>>& overrides);

struct RunResult {
  std::vector<double> loss, grad_norm;
  std::vector<std::vector<double>> mtp_loss;  // per step, each MTP depth's loss (empty without)
  int64_t expert_exchanges = 0, expert_overflows = 0;  // this rank's, over the steps
  int64_t padded_replays = 0;  // steps redone synced ([parallelism] expert_exchange = "padded")
};
// `steps` steps, each read back; then waits for a checkpoint save in flight.
RunResult run_steps(Trainer& t, int steps);
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
