// Writing a checkpoint. A Snapshot lists the tensors this rank writes (one replica of each piece:
// coordinate 0 on every group the tensor is replicated over; whole tensors on world rank 0), each
// cut to its real region (no padding), and copies them to host memory allocated once. The rank
// part (its safetensors file, then its manifest, renamed into place last) can run on any thread;
// rank 0 finalises when every rank's manifest is there: the index, fsyncs, one rename.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/index.h"
#include "meshtrain/optim/param_store.h"

namespace meshtrain {

// Checkpoint names of the optimizer state of parameter `param` (torchtitan's flattened names).
std::string exp_avg_name(const std::string& param);     // "optimizer.state.<param>.exp_avg"
std::string exp_avg_sq_name(const std::string& param);  // "optimizer.state.<param>.exp_avg_sq"
// Every tensor a checkpoint of this plan holds, in order: parameters and buffers, then, for full
// checkpoints, each trainable parameter's two moments.
struct CheckpointTensor {
  std::string name;
  const ParamInfo* param = nullptr;
  bool optimizer = false;  // a moment of `param`
};
std::vector<CheckpointTensor> checkpoint_tensors(const ParallelPlan& plan, bool model_only);
std::vector<std::string> checkpoint_tensor_names(const ParallelPlan& plan, bool model_only);

// Whether this rank's copy of p is the one a checkpoint stores.
bool writes_piece(const ParamInfo& p, const ParallelPlan& plan);

struct SnapshotItem {
  std::string name;  // in the checkpoint
  const ParamInfo* param = nullptr;
  Tensor source;  // the live tensor (local padded shard) on the backend's device
  Tensor host;    // what the writer reads: the staged copy, or `source` itself when unstaged
  Box region;     // the global region written (never empty)
  bool optimizer = false;
};

class Snapshot {
 public:
  // staged: copy into host buffers allocated here, once (async saves and device backends).
  // Unstaged (synchronous saves on the cpu backend) the writer reads the live tensors.
  Snapshot(const ParallelPlan& plan, const ParamStore& store, Backend& backend, bool staged);
  // Copies what the next save writes to the host and waits for the copies: the step loop's stall.
  void take(bool model_only);
  const std::vector<SnapshotItem>& items() const { return items_; }
  int64_t staged_bytes() const { return staged_bytes_; }

 private:
  Backend& backend_;
  bool staged_;
  std::vector<SnapshotItem> items_;
  int64_t staged_bytes_ = 0;
};

// Writes this rank's file (when it writes any tensor) and manifest into `dir`. export_dtype:
// the file dtype of every tensor (model-only saves); nullopt = each tensor's own dtype.
RankManifest write_rank_part(const std::string& dir, int rank, const Snapshot& snap,
                             bool model_only, std::optional<FileDType> export_dtype,
                             const LoaderPosition& loader, int64_t step);

// True once every rank's manifest is in `dir` (a manifest appears whole, by rename).
bool rank_parts_complete(const std::string& dir, int world);

// Rank 0: merges the `world` manifests in `tmp_dir` into an index (tensors in `order`; header,
// step and state from `head`, loader positions from the manifests), checks that every tensor is
// tiled by its slices, writes index.json, syncs, and renames tmp_dir to final_dir (never
// replacing it). Returns the index written; *write_seconds = the slowest rank's write time.
CheckpointIndex finalize_checkpoint(const std::string& tmp_dir, const std::string& final_dir,
                                    int world, CheckpointIndex head,
                                    const std::vector<std::string>& order, double* write_seconds);

}  // namespace meshtrain
