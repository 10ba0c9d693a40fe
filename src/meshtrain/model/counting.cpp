// Counting from declared parameters.
#include "meshtrain/model/counting.h"

#include <cmath>

namespace meshtrain {

ModelCounts count_model(const Model& model, const ParallelPlan& plan, int64_t seq_len) {
  ModelCounts c;
  for (const ParamInfo& p : plan.params()) {
    if (!p.trainable) continue;
    int64_t n = p.global_shape.numel();
    c.total_params += n;
    double active = double(n) * model.active_fraction(p);
    c.active_params += active;
    if (p.name == "tok_embeddings.weight") c.embedding_params += n;
  }
  c.active_non_embedding = c.active_params - double(c.embedding_params);
  c.flops_per_token = 6.0 * c.active_non_embedding + model.attention_flops_per_token(seq_len);
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
