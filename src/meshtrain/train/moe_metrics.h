// The expert load of each MoE layer over a step, as the log line and metrics.jsonl report it.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/ir/ir.h"
#include "meshtrain/train/metrics.h"

namespace meshtrain {

// One MoE layer's expert load over the last optimizer step (global over data-parallel ranks).
struct MoeLayerLoad {
  std::string layer;            // "layers.1.moe"
  BlockIndex block = kNoBlock;  // 1: the metrics are keyed by the block
  std::vector<double> tokens;   // routed tokens per expert
  double min = 0, max = 0, mean = 0;
  double imbalance = 0;  // max / mean (1 = perfectly balanced)
};
MoeLayerLoad summarize_moe_load(const std::string& layer, BlockIndex block,
                                std::vector<double> tokens);
// Adds moe.layers.<i>.load_{min,max,mean}, moe.layers.<i>.imbalance, moe.imbalance_avg and
// moe.imbalance_max to m.extra, and "moe load max/mean: avg A, worst W (layers.<i>)" to
// m.summary_suffix. Nothing for dense models.
void add_moe_load_metrics(const std::vector<MoeLayerLoad>& loads, StepMetrics& m);

}  // namespace meshtrain
