// Summaries of the experts' routed-token counts: per layer min/max/mean and imbalance, the
// worst layer for the log line.
#include "meshtrain/train/moe_metrics.h"

#include <algorithm>

#include "meshtrain/core/block_name.h"

namespace meshtrain {

MoeLayerLoad summarize_moe_load(const std::string& layer, BlockIndex block,
                                std::vector<double> tokens) {
  MoeLayerLoad l;
  l.layer = layer;
  l.block = block;
  l.tokens = std::move(tokens);
  if (l.tokens.empty()) return l;
  l.min = *std::min_element(l.tokens.begin(), l.tokens.end());
  l.max = *std::max_element(l.tokens.begin(), l.tokens.end());
  for (double t : l.tokens) l.mean += t;
  l.mean /= double(l.tokens.size());
  l.imbalance = l.mean > 0 ? l.max / l.mean : 0.0;
  return l;
}

void add_moe_load_metrics(const std::vector<MoeLayerLoad>& loads, StepMetrics& m) {
  if (loads.empty()) return;
  double sum = 0;
  const MoeLayerLoad* worst = &loads[0];
  // Block 3 -> "layers.3": keys read moe.layers.3.load_max (a layer outside the blocks: its path).
  auto block = [](const MoeLayerLoad& l) {
    return l.block == kNoBlock ? l.layer : block_name(l.block);
  };
  for (const MoeLayerLoad& l : loads) {
    const std::string key = "moe." + block(l);
    m.extra[key + ".load_min"] = l.min;
    m.extra[key + ".load_max"] = l.max;
    m.extra[key + ".load_mean"] = l.mean;
    m.extra[key + ".imbalance"] = l.imbalance;
    sum += l.imbalance;
    if (l.imbalance > worst->imbalance) worst = &l;
  }
  const double avg = sum / double(loads.size());
  m.extra["moe.imbalance_avg"] = avg;
  m.extra["moe.imbalance_max"] = worst->imbalance;
  m.summary_suffix = fmt::format("moe load max/mean: avg {:.2f}, worst {:.2f} ({})", avg,
                                 worst->imbalance, block(*worst));
}

}  // namespace meshtrain
