// `meshtrain convert`: a meshtrain checkpoint <-> a Hugging Face folder, offline, one process.
// This file only resolves what the conversion is (direction from the input folder, the model from
// the checkpoint's recorded config or from config.json) and shows progress; the streaming work is
// checkpoint/hf_convert.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct ConvertRequest {
  std::string input;   // a checkpoint step folder (index.json) or an HF folder (config.json)
  std::string output;  // created; must not exist
  // HF -> checkpoint: the TOML whose [model] the checkpoint is for (checked against config.json);
  // "" = the model config.json describes. Checkpoint -> HF: overrides of the recorded config.
  std::string config;
  std::vector<std::string> overrides;  // --section.key value
  std::string dtype = "float32";       // of the written tensors: float32 | bfloat16 | float16
  int64_t max_shard_bytes = int64_t(5) << 30;
};

// Runs the conversion, printing progress (a rewritten line on a terminal, a plain line every few
// seconds otherwise). Errors are meshtrain::Error naming the folder and tensor.
void run_convert(const ConvertRequest& request);

}  // namespace meshtrain
