// ParallelDims: the parallelism degrees of a run ([parallelism] in the TOML) and the rules that
// make them a valid mesh of `world` ranks. validate() is the only place a layout is accepted;
// every error is a one-line ConfigError naming the degrees and the world size.
#pragma once

#include <string>

namespace meshtrain {

struct ParallelDims {
  int dp_replicate = 1;  // data_parallel_replicate_degree (HSDP replicas)
  int dp_shard = -1;     // data_parallel_shard_degree; -1 = whatever the others leave
  int cp = 1;            // context_parallel_degree
  int tp = 1;            // tensor_parallel_degree
  int ep = 1;            // expert_parallel_degree (borrows ranks from dp_shard × cp × tp)
  int etp = 1;           // expert_tensor_parallel_degree: 1 or tp
  int world = 0;         // number of ranks; 0 = not set yet (DeviceMesh fills it in)

  // Resolves dp_shard = -1 to world / (dp_replicate × cp × tp) and checks every rule:
  // degrees >= 1, dp_replicate × dp_shard × cp × tp == world, etp ∈ {1, tp}, and ep divides
  // dp_shard × cp × tp (dp_shard × cp when etp == tp > 1, since etp then keeps the tp ranks).
  void validate();

  int dp() const { return dp_replicate * dp_shard; }             // data loading ranks
  int fsdp() const { return dp_shard * cp; }                     // dense parameter sharding
  int loss() const { return dp() * cp; }                         // token-count reduction
  int efsdp() const { return dp_shard * cp * tp / (ep * etp); }  // expert parameter sharding
  bool fsdp_enabled() const { return fsdp() > 1; }
  bool hsdp_enabled() const { return dp_replicate > 1 && fsdp() > 1; }
  // "hybrid_shard" (dp_replicate > 1 and fsdp > 1), "fully_shard" (fsdp > 1), "replicate"
  // (dp_replicate > 1 only) or "none".
  const char* mode_name() const;
  // "dp_replicate=1 dp_shard=2 cp=1 tp=2 ep=1 etp=1 (world 4, fully_shard)"
  std::string to_string() const;
};

}  // namespace meshtrain
