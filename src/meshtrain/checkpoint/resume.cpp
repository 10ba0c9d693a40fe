// CheckpointManager, the start-up side: which checkpoint (the folder's latest or load_step, else
// initial_load_path), the same choice on every rank, the load, the parts excluded from loading,
// the loader's position under the checkpoint's rule, and the startup summary line; and the
// options' list of excluded parts.
#include <algorithm>
#include <filesystem>

#include "meshtrain/checkpoint/hf_hook.h"
#include "meshtrain/checkpoint/load.h"
#include "meshtrain/checkpoint/manager.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Smallest and largest of v over the ranks of `comm` (start-up only: a host wait).
std::pair<int64_t, int64_t> min_max(Communicator& comm, Backend& backend, int64_t v) {
  if (comm.size() == 1) return {v, v};
  Tensor h = Tensor::from_vector(std::vector<int64_t>{v, -v}, Shape{2});
  const bool host = comm.device().is_cpu();
  Tensor d = host ? h : Tensor::empty(Shape{2}, DType::kI64, backend.allocator());
  Stream& s = backend.stream(0);
  if (!host) backend.copy(d.raw(), h.raw(), 16, CopyKind::kHostToDevice, s);
  comm.all_reduce(d, ReduceOp::kMin, s).wait();
  if (!host) backend.copy(h.raw(), d.raw(), 16, CopyKind::kDeviceToHost, s);
  // Host wait: the agreed values decide what every rank loads.
  s.synchronize();
  return {h.data<int64_t>()[0], -h.data<int64_t>()[1]};
}

std::string megabytes(int64_t b) { return fmt::format("{:.1f} MB", double(b) / 1e6); }

bool contains(const std::vector<std::string>& v, const char* x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::vector<std::string> CheckpointOptions::excluded() const {
  std::vector<std::string> parts;
  size_t from = 0;
  while (from <= exclude_from_loading.size()) {
    size_t comma = exclude_from_loading.find(',', from);
    if (comma == std::string::npos) comma = exclude_from_loading.size();
    std::string part = exclude_from_loading.substr(from, comma - from);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) parts.push_back(part);
    from = comma + 1;
  }
  return parts;
}

void CheckpointManager::check_no_overwrite(int64_t from_step) const {
  for (int64_t s : list_checkpoints(options_.folder)) {
    const bool saved =
        s == run_.training_steps || (options_.interval > 0 && s % options_.interval == 0);
    MT_CHECK_T(ConfigError, !(s > from_step && s <= run_.training_steps && saved),
               "{} already holds checkpoint step-{}, which this run (starting at step {}) would "
               "save again, and an existing checkpoint is never replaced: resume from the latest "
               "(leave [checkpoint] load_step at -1) or use another [checkpoint] folder",
               options_.folder, s, from_step);
  }
}

ResumePoint CheckpointManager::load_at_start() {
  ResumePoint rp;
  if (!options_.enable) {
    if (!options_.initial_load_path.empty())
      log_warn(
          "checkpoint: initial_load_path is set but [checkpoint] enable is false: "
          "nothing is loaded");
    return rp;
  }
  // The choice: a step of the folder (-1: none), the same on every rank.
  const std::vector<int64_t> steps = list_checkpoints(options_.folder);
  int64_t step = -1;
  if (!steps.empty()) {
    step = options_.load_step >= 0 ? options_.load_step : steps.back();
    MT_CHECK_T(ConfigError, std::count(steps.begin(), steps.end(), step) == 1,
               "[checkpoint] load_step = {}: {} holds no complete checkpoint step-{} (it holds "
               "step {})",
               step, options_.folder, step, fmt::join(steps, ", step "));
  }
  const auto [lo, hi] = min_max(world_, backend_, step);
  MT_CHECK_T(ConfigError, lo == hi,
             "ranks see different checkpoints in {} (this rank: {}; over all ranks from {} to "
             "{}): the checkpoint folder must be on a filesystem every rank shares",
             options_.folder, step, lo, hi);
  std::string dir;
  bool model_only = false, hf = false;
  if (step >= 0) {
    dir = step_dir(step);
    model_only = step == 0;  // step 0 is a seed checkpoint: weights only (as torchtitan)
    if (!options_.initial_load_path.empty())
      log_warn("checkpoint: {} holds checkpoints; initial_load_path {} is not used",
               options_.folder, options_.initial_load_path);
  } else if (!options_.initial_load_path.empty()) {
    dir = options_.initial_load_path;
    MT_CHECK_T(ConfigError, fs::exists(dir), "[checkpoint] initial_load_path {} does not exist",
               dir);
    model_only = options_.initial_load_model_only;
    hf = options_.initial_load_in_hf;
  } else {
    MT_CHECK_T(ConfigError, options_.load_step < 0,
               "[checkpoint] load_step = {}: {} holds no complete checkpoint", options_.load_step,
               options_.folder);
    log_info("checkpoint: no checkpoint in {}; starting from step 0 (saving every {} steps{})",
             options_.folder, options_.interval, options_.async() ? ", async" : "");
    check_no_overwrite(0);
    return rp;
  }

  const std::vector<std::string> ex = options_.excluded();
  if (hf) {
    const HfLoadStats st = load_hf_checkpoint(
        dir, HfContext{model_, plan_, store_, backend_, world_, loader_.seq_len()});
    log_info(
        "checkpoint: loaded Hugging Face weights from {}, read {} on this rank; training "
        "starts at step 0",
        dir, megabytes(st.bytes_read));
    rp.loaded = true;
    check_no_overwrite(0);
    return rp;
  }
  const CheckpointIndex ix = read_checkpoint_index(dir);
  MT_CHECK_T(ConfigError, model_only || !ix.model_only,
             "checkpoint {} holds only model weights (saved with last_save_model_only = true): it "
             "cannot restore the optimizer and training state; pick a full checkpoint with "
             "[checkpoint] load_step, or load it as initial weights with initial_load_path and "
             "initial_load_model_only = true",
             dir);
  const bool with_optimizer = !model_only && !contains(ex, "optimizer");
  check_checkpoint_matches(ix, dir, plan_, with_optimizer);
  const TrainState& s = ix.state;
  const bool data = !model_only && !contains(ex, "dataloader");
  if (data)
    MT_CHECK_T(ConfigError,
               s.seq_len == loader_.seq_len() &&
                   s.windows_per_epoch == loader_.windows_per_epoch() && s.seed == run_.seed,
               "checkpoint {} read its data with seq_len {}, {} windows per epoch and seed {}; "
               "this run has seq_len {}, {} windows per epoch and seed {}: its data position does "
               "not carry over. Restore those settings, or add \"dataloader\" to [checkpoint] "
               "exclude_from_loading to start the data from its beginning",
               dir, s.seq_len, s.windows_per_epoch, s.seed, loader_.seq_len(),
               loader_.windows_per_epoch(), run_.seed);
  const LoadStats st =
      load_checkpoint_tensors(dir, ix, plan_, store_, backend_, with_optimizer, rank_, world_size_);
  rp.loaded = true;
  std::vector<std::string> fresh;
  if (!model_only) {
    rp.step = contains(ex, "train_state") ? 0 : s.step;
    rp.optimizer_step = with_optimizer ? s.optimizer_step : 0;
    rp.lr_step = contains(ex, "lr_scheduler") ? 0 : s.lr_step;
    // The loader rule: the run continues at the first window no rank has read (window numbers
    // are global, so any data-parallel layout of the same global batch reads the same rows).
    loader_.resume_at(rp.step, data ? s.next_window : 0);
    if (data && s.dp_degree == run_.dp_degree && s.local_batch == loader_.local_batch() &&
        s.accum_steps == run_.accum_steps) {
      const LoaderPosition& mine = s.loader.at(size_t(run_.dp_rank));
      MT_CHECK(mine.micro_batch != 0 ||
                   loader_.window_index(rp.step, 0, run_.dp_rank, 0) == mine.next_window,
               "dp rank {} resumes at window {}, the checkpoint says {}", run_.dp_rank,
               loader_.window_index(rp.step, 0, run_.dp_rank, 0), mine.next_window);
    }
    for (const char* part : {"optimizer", "lr_scheduler", "dataloader", "train_state"})
      if (contains(ex, part)) fresh.push_back(part);
  }
  check_no_overwrite(rp.step);
  const std::string read =
      fmt::format("read {} on this rank from {} file{} (+ {} checksummed) in {:.2f} s",
                  megabytes(st.bytes_read), st.files_read, st.files_read == 1 ? "" : "s",
                  megabytes(st.bytes_verified), st.seconds);
  if (model_only) {
    log_info(
        "checkpoint: loaded the model weights of {} (step {}, written on {}), {}; training "
        "starts at step 0",
        dir, ix.step, s.layout.describe(), read);
  } else {
    log_info("checkpoint: resumed from step {} of {} (written on {}; this run: {}), {}{}", ix.step,
             dir, s.layout.describe(), run_.layout.describe(), read,
             fresh.empty()
                 ? std::string()
                 : fmt::format("; fresh, as excluded from loading: {}", fmt::join(fresh, ", ")));
    if (data && (s.dp_degree != run_.dp_degree || s.local_batch != loader_.local_batch() ||
                 s.accum_steps != run_.accum_steps))
      log_info(
          "checkpoint: data resumes at window {} (saved with dp {} × {} rows × {} "
          "micro-batches, now dp {} × {} × {})",
          s.next_window, s.dp_degree, s.local_batch, s.accum_steps, run_.dp_degree,
          loader_.local_batch(), run_.accum_steps);
  }
  return rp;
}

}  // namespace meshtrain
