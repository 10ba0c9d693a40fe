// Step graphs the graph-pass tests inspect without running them: a config's step graph on one rank
// with the options given (it builds anywhere), the bf16-compute-over-fp32-masters form the
// mixed-precision passes (fuse_grad_matmul and the accumulating forms) act on, and a count of live
// nodes of one op.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {

// The graph keeps pointers into the layout, so the three live together.
struct BuiltStepGraph {
  JobConfig cfg;
  MeshLayout layout;
  RankGroups groups;
  std::unique_ptr<StepGraph> sg;
  BuiltStepGraph(JobConfig c, const StepGraphOptions& options)
      : cfg(std::move(c)), layout(parallel_dims_of(cfg, 1)), groups(layout, 0) {
    sg = build_step_graph(cfg, &groups, options);
  }
};

// configs/CONFIG (e.g. "llama3_debug.toml") with `overrides` (--section.key value pairs), in the
// configured dtypes (float32 on CPU).
inline std::unique_ptr<BuiltStepGraph> step_graph_of(
    const std::string& config, const std::vector<std::string>& overrides = {}) {
  return std::make_unique<BuiltStepGraph>(
      parse_job_config(std::string(MT_TEST_SOURCE_DIR) + "/configs/" + config, overrides),
      StepGraphOptions{.tokenizer_vocab = 258});
}

// The same under bf16 compute over fp32 masters.
inline std::unique_ptr<BuiltStepGraph> bf16_step_graph(
    const std::string& config, const std::vector<std::string>& overrides = {}) {
  return std::make_unique<BuiltStepGraph>(
      parse_job_config(std::string(MT_TEST_SOURCE_DIR) + "/configs/" + config, overrides),
      StepGraphOptions{.tokenizer_vocab = 258,
                       .compute_dtype = DType::kBF16,
                       .master_dtype = DType::kF32,
                       .reduce_dtype = DType::kF32,
                       .overwrite_grads = true});
}

inline int live_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += !node.dead && node.op == op;
  return n;
}

}  // namespace meshtrain
