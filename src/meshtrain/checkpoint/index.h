// The checkpoint index (index.json in a step-N folder) and the per-rank manifests it is merged
// from: every global tensor with its shape, file dtype and stored slices (file, byte range, box in
// the global tensor); every file with its size and CRC-32; the training state and the config the
// checkpoint was written with. Rule: parse() accepts only a complete, self-consistent index
// (every slice inside its tensor and its file, slices of a tensor disjoint and covering it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/region.h"

namespace meshtrain {

constexpr const char* kIndexFile = "index.json";
constexpr int kIndexVersion = 1;

struct StoredSlice {
  std::string file;            // inside the step folder
  Box box;                     // where the slice sits in the global tensor
  int64_t begin = 0, end = 0;  // absolute byte range in the file
};

struct StoredTensor {
  std::string name;
  FileDType dtype = FileDType::kF32;
  std::vector<int64_t> shape;  // global
  std::vector<StoredSlice> slices;
};

struct StoredFile {
  std::string name;
  int rank = 0;  // the rank that wrote it
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// One data-parallel rank's loader position after the checkpoint's step.
struct LoaderPosition {
  int64_t dp_rank = 0, step = 0, micro_batch = 0, epoch = 0, window_offset = 0;
  int64_t next_window = 0;  // the global window this rank's next micro-batch starts at
};

struct MeshDegrees {
  int world = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, ep = 1, etp = 1;
  bool operator==(const MeshDegrees&) const = default;
  std::string describe() const;  // "4 ranks: dp_shard 4, ep 2"
};

struct TrainState {
  int64_t step = 0;            // optimizer steps done ("train_state")
  int64_t optimizer_step = 0;  // AdamW's step count, for bias correction ("optimizer")
  int64_t lr_step = 0;         // steps taken on the LR schedule ("lr_scheduler")
  double lr = 0;               // of the last step (for the log)
  // RNG: every random number is counter-based from (seed, tensor name, element) and (seed, epoch)
  // of the data shuffle, so the seed and the positions above are the whole generator state.
  uint64_t seed = 0;
  // The data loader ("dataloader"): its layout, the dataset it read, and every dp rank's position.
  std::string dataset;
  int64_t seq_len = 0, local_batch = 0, dp_degree = 0, accum_steps = 0, windows_per_epoch = 0;
  int64_t next_window = 0;             // the run's position: the first window no rank has read
  std::vector<LoaderPosition> loader;  // one per dp rank, in dp order
  MeshDegrees layout;                  // the mesh it was written on
  std::string master_dtype;
};

struct CheckpointIndex {
  int version = kIndexVersion;
  int64_t step = 0;
  bool model_only = false;  // weights (and buffers) only: no optimizer or training state
  TrainState state;
  std::string config_toml;  // the effective config of the run that wrote it
  std::vector<StoredFile> files;
  std::vector<StoredTensor> tensors;  // in the writing model's declaration order

  const StoredTensor* find(std::string_view name) const;
  const StoredFile* file(std::string_view name) const;
  int64_t total_bytes() const;
  std::string to_json() const;
  // IoError "<where> is corrupted: ..." for bad JSON, a missing field or an inconsistent slice.
  static CheckpointIndex parse(std::string_view json, const std::string& where);
};

// One rank's part of a save: its file (if it wrote one) and the slices in it, its loader position.
struct RankManifest {
  int rank = 0;
  StoredFile file;  // name "" when the rank wrote nothing (all its tensors are replicas)
  std::vector<StoredTensor> tensors;  // one slice each, in this file
  LoaderPosition loader;
  double write_seconds = 0;
  std::string to_json() const;
  static RankManifest parse(std::string_view json, const std::string& where);
};
std::string manifest_name(int rank);   // "rank-00003.json"
std::string rank_file_name(int rank);  // "rank-00003.safetensors"

// IoError naming the tensor unless its slices are disjoint and tile its whole shape.
void check_tiling(const StoredTensor& t, const std::string& where);

}  // namespace meshtrain
