// The hook through which the checkpoint policy reads and writes Hugging Face weights
// ([checkpoint] initial_load_in_hf, last_save_in_hf). The policy decides when (start-up, the last
// step) and where; these two functions own the HF layout (names, per-expert tensors, Llama's q/k
// permutation, FP8 dequantisation). Rule: every rank calls them together, from the main thread,
// with no save in flight; they may use the world communicator.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/model.h"
#include "meshtrain/optim/param_store.h"

namespace meshtrain {

struct HfContext {
  const Model& model;  // family, flavor and shapes (the HF names and layouts derive from it)
  const ParallelPlan& plan;
  ParamStore& store;  // this rank's masters and buffers
  Backend& backend;
  Communicator& world;
  int64_t seq_len = 0;  // [training] seq_len: whether YaRN applies (config.json check and export)
};

struct HfLoadStats {
  int64_t bytes_read = 0;  // by this rank
  int files_read = 0;
};

// Whether this build reads and writes HF weights (checked at start-up, so a run that would end
// with an HF save it cannot make fails before training).
bool hf_checkpoint_supported();

// Fills this rank's masters (and expert_bias buffers) from the HF folder `folder`
// (model.safetensors.index.json + shards, config.json). The optimizer state stays fresh.
HfLoadStats load_hf_checkpoint(const std::string& folder, const HfContext& ctx);

// Writes the model in HF layout into `folder` (created by the caller, empty; the caller makes it
// visible with a rename after every rank returns), every tensor in `dtype`.
void save_hf_checkpoint(const std::string& folder, const HfContext& ctx, FileDType dtype);

}  // namespace meshtrain
