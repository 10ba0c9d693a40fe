// Offline conversion between meshtrain checkpoints and Hugging Face folders, in one process,
// streaming: at most one chunk of rows (~64 MiB) of one tensor is in memory at a time, so a 671B
// conversion needs neither the model's memory nor its rank layout. The rule: the output appears
// only complete (written as "<out>.tmp", renamed last) and never replaces anything.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/hf_export.h"
#include "meshtrain/checkpoint/index.h"
#include "meshtrain/model/model.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

struct ConvertOptions {
  FileDType dtype = FileDType::kF32;  // of every tensor written
  int64_t max_shard_bytes = int64_t(5) << 30;
  int64_t chunk_bytes = int64_t(64) << 20;
  std::function<void(const HfProgress&)> progress;
};

// Global tensors of a meshtrain checkpoint folder, read box by box from the stored slices that
// intersect the box (ranged reads of the mapped rank files).
class CheckpointSource final : public TensorSource {
 public:
  CheckpointSource(std::string dir, const CheckpointIndex& index);
  ~CheckpointSource() override;
  void read_box(const std::string& name, const std::vector<int64_t>& begin,
                const std::vector<int64_t>& count, DType to, void* dst) override;
  int64_t bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// meshtrain checkpoint `dir` (index already read) of the model `model` / `plan` (one rank) ->
// HF folder `out`. ValueError when the checkpoint does not hold exactly the model's tensors.
void convert_checkpoint_to_hf(const std::string& dir, const CheckpointIndex& index,
                              const Model& model, const ParallelPlan& plan, int64_t seq_len,
                              DType compute, const std::string& out, const ConvertOptions& o);

// HF folder `hf_dir` -> a model-only meshtrain checkpoint `out` (a step-0 folder that
// initial_load_path loads) of `model` / `plan`, config_toml recorded in its index. Shards are
// files of at most max_shard_bytes; fp8 weights are dequantised.
void convert_hf_to_checkpoint(const std::string& hf_dir, const Model& model,
                              const ParallelPlan& plan, int64_t seq_len, DType compute,
                              const std::string& config_toml, const std::string& out,
                              const ConvertOptions& o);

}  // namespace meshtrain
