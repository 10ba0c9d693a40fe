// Parameter and FLOP counting for `meshtrain plan`, the start-up summary and MFU. Counts come
// from the parameters the model actually declared (global shapes), not from a formula kept
// beside it. FLOPs per token follow torchtitan: 6 × (active params − input embedding) + the
// attention term of the model, with the head shared by the MTP depths counted once per depth.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/model/model.h"

namespace meshtrain {

struct ModelCounts {
  int64_t total_params = 0;
  double active_params = 0;      // routed experts counted at top_k / num_experts
  int64_t embedding_params = 0;  // tok_embeddings only (the output projection is a matmul)
  double active_non_embedding = 0;
  int64_t mtp_params = 0;  // of the multi-token-prediction modules (their blocks), in total
  // Training (forward + backward): the output head counts once per prediction depth.
  double flops_per_token = 0;
};

ModelCounts count_model(const Model& model, const ParallelPlan& plan, int64_t seq_len);
// "15.71B" / "6.43M" style.
std::string human_count(double n);

}  // namespace meshtrain
