// Counting from declared parameters (the MTP modules' blocks by their parsed block index).
#include "meshtrain/model/counting.h"

#include <cmath>

#include "meshtrain/core/block_name.h"

namespace meshtrain {

namespace {
int block_of_param(const std::string& name) {
  const std::optional<ParsedBlockName> p = parse_block_name(name);
  return p ? p->index : -1;
}
}  // namespace

ModelCounts count_model(const Model& model, const ParallelPlan& plan, int64_t seq_len) {
  ModelCounts c;
  double multiplied = 0;  // active non-embedding parameters times their uses per token
  for (const ParamInfo& p : plan.params()) {
    if (!p.trainable) continue;
    int64_t n = p.global_shape.numel();
    c.total_params += n;
    double active = double(n) * model.active_fraction(p);
    c.active_params += active;
    if (p.name == "tok_embeddings.weight")
      c.embedding_params += n;
    else
      multiplied += active * model.uses_per_token(p);
    if (model.mtp_depth_of_block(block_of_param(p.name)) > 0) c.mtp_params += n;
  }
  c.active_non_embedding = c.active_params - double(c.embedding_params);
  c.flops_per_token = 6.0 * multiplied + model.attention_flops_per_token(seq_len);
  return c;
}

std::string human_count(double n) {
  double a = std::abs(n);
  if (a >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (a >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (a >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (a >= 1e3) return fmt::format("{:.2f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace meshtrain
