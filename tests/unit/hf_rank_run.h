// One (virtual) CPU rank of a run for the HF tests: its graph, plan and parameter store, built
// from a job config and a seed, and the HfRunContext the HF save/load functions take.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {

struct RankRun {
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<StepGraph> sg;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ParamStore> store;
  HfRunContext ctx(std::function<void()> barrier = {}) const {
    return HfRunContext{*sg->model,
                        *sg->plan,
                        *store,
                        *backend,
                        sg->seq_len,
                        DType::kF32,
                        groups ? groups->group_rank(MeshGroup::kWorld) : 0,
                        std::move(barrier)};
  }
  std::vector<float> host(const std::string& name) const {
    return store->master(name).to_vector<float>();
  }
};

// Rank `rank` of a `world`-rank run of cfg, parameters initialised from `seed`.
inline RankRun make_run(const JobConfig& cfg, int world = 1, int rank = 0, uint64_t seed = 11) {
  RankRun r;
  if (world > 1)
    r.groups = std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, world)), rank);
  r.sg = build_step_graph(cfg, r.groups.get(), {.tokenizer_vocab = 258});
  r.backend = create_backend("cpu", 0);
  r.store = std::make_unique<ParamStore>(*r.sg->plan, *r.backend);
  r.store->initialize(seed);
  return r;
}

}  // namespace meshtrain
