// [debug] dump_step = N: what an external reference (tests/reference/crosscheck.py) needs to
// replay step N, under <dump_folder>/debug/step-N/: model/ (the weights step N starts from, an HF
// folder), gradients.safetensors (step N's global gradients under HF names, before clipping),
// moe_load.json (tokens per expert of every MoE layer in step N) and dump.json (the windows the
// step read). The rule: each file is written by the ranks that own its rows, and appears whole.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_checkpoint.h"

namespace meshtrain {

struct DumpStepInfo {
  int64_t step = 0;
  int64_t seq_len = 0;
  int64_t rows_per_step = 0;      // windows of seq_len + 1 tokens in the global batch
  int64_t window_begin = 0;       // the step's first window (then rows_per_step in a row)
  int64_t windows_per_epoch = 0;  // windows wrap around at this count
  std::string dataset;
  double loss = 0, grad_norm = 0, lr = 0;
};

class DebugDump {
 public:
  DebugDump(const std::string& dump_folder, int64_t step);
  bool at(int64_t step) const { return step_ > 0 && step == step_; }
  const std::string& folder() const { return folder_; }

  void weights(const HfRunContext& run) const;    // before the step's first micro-batch
  void gradients(const HfRunContext& run) const;  // after its last backward, before the update
  // After the update (rank 0): dump.json and the expert loads (layer -> tokens per expert).
  void summary(const DumpStepInfo& info,
               const std::vector<std::pair<std::string, std::vector<double>>>& loads) const;

 private:
  int64_t step_ = 0;
  std::string folder_;
};

}  // namespace meshtrain
