// CheckpointManager: the [checkpoint] policy. At start-up it resumes from the latest complete
// checkpoint of its folder (or load_step), else from initial_load_path; after each step it saves
// on the interval and at the last step. A save becomes visible only complete: ranks write into
// .step-N.tmp, rank 0 renames it to step-N once every rank's manifest is there, then keep_latest_k
// prunes. Async saves stall the step loop only for the host snapshot; a background thread writes,
// and only ever does file I/O: every collective (the barriers) runs on the main thread, at the
// next save or at exit, so none can interleave with a step's collectives on the same communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint_options.h"
#include "meshtrain/checkpoint/index.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/model/model.h"
#include "meshtrain/optim/param_store.h"

namespace meshtrain {

// What the run is, for the index and the checks on resume.
struct CheckpointRun {
  std::string config_toml;
  MeshDegrees layout;
  uint64_t seed = 0;
  std::string dataset;  // the loader's description
  int64_t training_steps = 0;
  int64_t dp_rank = 0, dp_degree = 1, accum_steps = 1;
  std::string master_dtype;
};

// Where the run continues after start-up: the trainer's step and the positions of the parts that
// count steps (equal to `step` unless a part was excluded from loading or loaded model-only).
struct ResumePoint {
  int64_t step = 0, optimizer_step = 0, lr_step = 0;
  bool loaded = false;
};

class CheckpointManager {
 public:
  CheckpointManager(CheckpointOptions options, CheckpointRun run, const Model& model,
                    const ParallelPlan& plan, ParamStore& store, Backend& backend,
                    Communicator& world, TokenLoader& loader);
  // Waits for a save in flight (errors are logged; during unwinding only the thread is joined).
  ~CheckpointManager();

  // Start-up: loads what the options say and restores the loader; logs what it did.
  ResumePoint load_at_start();
  // After optimizer step `step`: completes an async save whose files are written, and saves
  // when due (every `interval` steps, and at the last step).
  void after_step(int64_t step, int64_t optimizer_step, int64_t lr_step, double lr);
  // Whether after_step(step, ...) saves.
  bool saves_at(int64_t step) const;
  // A save at `step` now, off the interval (a stop signal), unless this step was just saved.
  void save_now(int64_t step, int64_t optimizer_step, int64_t lr_step, double lr);
  // The latest complete checkpoint folder, "" when none (named by errors that keep it intact).
  std::string latest_complete() const;
  // Waits for the save in flight, if any, and makes it visible (collective: every rank calls it).
  // A rank whose part failed (ENOSPC, EIO, ...) makes every rank fail together: the partial folder
  // is removed, then IoError (naming the file on the rank that hit it), or a warning and training
  // goes on when continue_on_save_error is set.
  void wait();

  const CheckpointOptions& options() const { return options_; }

 private:
  struct Pending;
  void save(int64_t step, int64_t optimizer_step, int64_t lr_step, double lr, bool last);
  void poll();
  void finalize_pending();
  int first_failed_rank(bool failed);  // collective
  void save_failed(const std::string& tmp, int64_t step, std::exception_ptr error, int rank);
  void check_no_overwrite(int64_t from_step) const;
  std::string step_dir(int64_t step) const;

  CheckpointOptions options_;
  CheckpointRun run_;
  const Model& model_;
  const ParallelPlan& plan_;
  ParamStore& store_;
  Backend& backend_;
  Communicator& world_;
  TokenLoader& loader_;
  int rank_ = 0, world_size_ = 1;
  std::unique_ptr<class Snapshot> snapshot_;
  std::unique_ptr<Pending> pending_;
  bool in_flight_ = false;  // a save was started and not yet waited for (the same on every rank)
  int64_t last_saved_step_ = -1;
  Tensor flag_, host_flag_;  // first_failed_rank's all-reduce
};

// Complete checkpoints (step-N folders with an index.json) in `folder`, by ascending step.
std::vector<int64_t> list_checkpoints(const std::string& folder);

}  // namespace meshtrain
