// A training run's parameters to and from Hugging Face folders: every rank loads its own pieces
// (initial_load_in_hf) and writes its own rows (last_save_in_hf, the debug dump). The rule: a save
// is visible only once complete (written into "<folder>.tmp", renamed by rank 0 after every rank
// has synced), and a row held by several ranks (replicas) is written by exactly one of them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/runtime/backend.h"

namespace meshtrain {

struct HfRunContext {
  const Model& model;
  const ParallelPlan& plan;
  ParamStore& store;
  Backend& backend;
  int64_t seq_len = 0;
  DType compute_dtype = DType::kF32;
  int world_rank = 0;
  std::function<void()> barrier;  // every rank of the run; may be empty on one rank
};

struct HfLoadReport {
  std::vector<std::string> notes;  // how config.json differs in rounding or a documented rule
  int64_t tensors = 0;             // pieces loaded on this rank
  int64_t bytes_read = 0;          // from the folder's files, on this rank
  int files = 0;                   // safetensors files of the folder
};

// Checks config.json against the model (ConfigError with every difference that changes what is
// computed), the tensors against the layout (missing/extra/shape/dtype, ValueError naming the
// tensor), then fills this rank's master pieces and expert biases.
HfLoadReport load_hf_into_store(const std::string& folder, const HfRunContext& run);

enum class HfSaveWhat { kWeights, kGradients };

struct HfSaveOptions {
  FileDType dtype = FileDType::kF32;  // [checkpoint] export_dtype
  int64_t max_shard_bytes = int64_t(5) << 30;
  HfSaveWhat what = HfSaveWhat::kWeights;
  // kGradients: one safetensors file (gradients.safetensors by default) instead of a folder.
  std::string gradients_file = "gradients.safetensors";
};

// Writes the HF layout into the existing, empty folder `dir` (config.json, index, shards of at most
// max_shard_bytes); the caller makes it visible. Every rank calls it.
void write_hf_folder(const std::string& dir, const HfRunContext& run, FileDType dtype,
                     int64_t max_shard_bytes = int64_t(5) << 30);

// Writes the HF folder `folder` (weights: config.json, index, shards) or, for gradients, the file
// `folder`/gradients_file holding the global gradient of every parameter under its HF name.
// IoError if `folder` already exists.
void save_hf_from_store(const std::string& folder, const HfRunContext& run,
                        const HfSaveOptions& options);

// "float32" | "bfloat16" | "float16" ([checkpoint] export_dtype) -> the file dtype.
FileDType export_file_dtype(const std::string& export_dtype);
const char* torch_dtype_name(FileDType d);

}  // namespace meshtrain
