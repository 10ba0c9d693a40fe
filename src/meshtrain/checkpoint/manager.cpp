// CheckpointManager, the save side: when to save, the temporary folder, the snapshot, the writer
// thread (file I/O only), the barriers and rank 0's finalisation, keep_latest_k, and the log line
// that measures a save (stall, write time, bytes, bandwidth).
#include "meshtrain/checkpoint/manager.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <limits>
#include <regex>
#include <thread>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/hf_hook.h"
#include "meshtrain/checkpoint/save.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} kB", b / 1e3);
}

// create_directories with the error a user reads (the folder, and why).
void make_folder(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  MT_CHECK_T(IoError, !ec && fs::is_directory(path),
             "cannot create checkpoint folder {}: {} (is [checkpoint] folder under a writable "
             "[job] dump_folder?)",
             path, ec ? ec.message() : "exists and is not a folder");
}
}  // namespace

struct CheckpointManager::Pending {
  int64_t step = 0;
  bool model_only = false;
  std::string tmp, final_dir;
  CheckpointIndex head;  // rank 0: everything but the files, slices and loader positions
  std::thread thread;
  std::atomic<bool> done{false};
  std::exception_ptr error, finalize_error;
  bool joined = false, finalized = false;
  double stall_seconds = 0;
  std::chrono::steady_clock::time_point written_from;  // the end of the snapshot
};

std::vector<int64_t> list_checkpoints(const std::string& folder) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return steps;
  static const std::regex name("step-([0-9]{1,18})");
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, m, name) && fs::is_regular_file(e.path() / kIndexFile, ec))
      steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

CheckpointManager::CheckpointManager(CheckpointOptions options, CheckpointRun run,
                                     const Model& model, const ParallelPlan& plan,
                                     ParamStore& store, Backend& backend, Communicator& world,
                                     TokenLoader& loader)
    : options_(std::move(options)),
      run_(std::move(run)),
      model_(model),
      plan_(plan),
      store_(store),
      backend_(backend),
      world_(world),
      loader_(loader),
      rank_(world.rank()),
      world_size_(world.size()) {
  if (!options_.enable) return;
  MT_CHECK_T(ConfigError, !(options_.last_save_in_hf && !hf_checkpoint_supported()),
             "[checkpoint] last_save_in_hf = true: writing Hugging Face weights is not built yet "
             "in this meshtrain");
  install_write_fault_from_env(rank_);
  if (rank_ == 0) {
    make_folder(options_.folder);
    // Temporary folders of saves that never finished (a killed run) are not checkpoints.
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(options_.folder, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".step-", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".tmp") {
        log_warn("checkpoint: removing {}, the remains of a save that did not finish",
                 e.path().string());
        fs::remove_all(e.path(), ec);
      }
    }
  }
  // Host memory for the snapshot, allocated once, here: async saves copy into it while the step
  // loop waits; a device backend needs it for any save. Synchronous cpu saves read the shards.
  const bool staged = options_.async() || !backend_.device().is_cpu();
  snapshot_ = std::make_unique<Snapshot>(plan_, store_, backend_, staged);
}

CheckpointManager::~CheckpointManager() {
  if (!pending_) return;
  if (std::uncaught_exceptions() > 0 || !in_flight_) {
    // Unwinding (another error is on its way to main): no collective, only the thread.
    if (pending_->thread.joinable()) pending_->thread.join();
    return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    log_warn("checkpoint: the save in flight failed: {}", e.what());
  }
}

std::string CheckpointManager::step_dir(int64_t step) const {
  return (fs::path(options_.folder) / fmt::format("step-{}", step)).string();
}

void CheckpointManager::after_step(int64_t step, int64_t optimizer_step, int64_t lr_step,
                                   double lr) {
  if (!options_.enable || options_.load_only) return;
  poll();
  if (saves_at(step)) save(step, optimizer_step, lr_step, lr, step == run_.training_steps);
}

bool CheckpointManager::saves_at(int64_t step) const {
  if (!options_.enable || options_.load_only) return false;
  return step == run_.training_steps || (options_.interval > 0 && step % options_.interval == 0) ||
         (options_.enable_first_step_checkpoint && step == 1);
}

void CheckpointManager::save_now(int64_t step, int64_t optimizer_step, int64_t lr_step, double lr) {
  if (!options_.enable || options_.load_only || last_saved_step_ == step) return;
  save(step, optimizer_step, lr_step, lr, step == run_.training_steps);
}

std::string CheckpointManager::latest_complete() const {
  const std::vector<int64_t> steps = list_checkpoints(options_.folder);
  return steps.empty() ? std::string() : step_dir(steps.back());
}

void CheckpointManager::save(int64_t step, int64_t optimizer_step, int64_t lr_step, double lr,
                             bool last) {
  wait();  // a save waits for the one before it
  last_saved_step_ = step;
  auto p = std::make_unique<Pending>();
  p->step = step;
  p->model_only = last && options_.last_save_model_only;
  p->final_dir = step_dir(step);
  p->tmp = (fs::path(options_.folder) / fmt::format(".step-{}.tmp", step)).string();
  if (rank_ == 0) {
    MT_CHECK_T(IoError, !fs::exists(p->final_dir),
               "cannot save step {}: {} already exists (an existing checkpoint is never replaced)",
               step, p->final_dir);
    std::error_code ec;
    fs::remove_all(p->tmp, ec);
    make_folder(p->tmp);
  }
  // The temporary folder exists before any rank writes into it.
  world_.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (last && options_.last_save_in_hf) {
    save_hf_checkpoint(p->tmp,
                       HfContext{model_, plan_, store_, backend_, world_, loader_.seq_len()},
                       options_.export_dtype);
    world_.barrier();
    if (rank_ == 0) {
      sync_directory(p->tmp);
      rename_no_replace(p->tmp, p->final_dir);
      sync_directory(options_.folder);
      log_info("checkpoint: step {} saved in Hugging Face layout to {} in {:.2f} s", step,
               p->final_dir, seconds_since(t0));
    }
    world_.barrier();
    return;
  }
  snapshot_->take(p->model_only);
  p->stall_seconds = seconds_since(t0);
  p->written_from = std::chrono::steady_clock::now();
  if (rank_ == 0) {
    CheckpointIndex& h = p->head;
    h.step = step;
    h.model_only = p->model_only;
    h.config_toml = run_.config_toml;
    TrainState& s = h.state;
    s.step = step, s.optimizer_step = optimizer_step, s.lr_step = lr_step, s.lr = lr;
    s.seed = run_.seed, s.dataset = run_.dataset, s.layout = run_.layout;
    s.master_dtype = run_.master_dtype;
    s.seq_len = loader_.seq_len(), s.local_batch = loader_.local_batch();
    s.dp_degree = run_.dp_degree, s.accum_steps = run_.accum_steps;
    s.windows_per_epoch = loader_.windows_per_epoch();
    s.next_window = loader_.next_window();
  }
  const TokenLoader::State ls = loader_.state();
  const LoaderPosition lp{
      run_.dp_rank,     ls.step,
      ls.micro_batch,   ls.epoch,
      ls.window_offset, loader_.window_index(ls.step, ls.micro_batch, run_.dp_rank, 0)};
  const std::optional<FileDType> dtype =
      p->model_only ? std::optional<FileDType>(options_.export_dtype) : std::nullopt;
  Pending* raw = p.get();
  auto work = [this, raw, lp, dtype] {
    try {
      write_rank_part(raw->tmp, rank_, *snapshot_, raw->model_only, dtype, lp, raw->step);
    } catch (...) {
      raw->error = std::current_exception();
    }
    raw->done = true;
  };
  pending_ = std::move(p);
  in_flight_ = true;
  if (options_.async()) {
    pending_->thread = std::thread(work);
    log_info("checkpoint: step {} snapshot taken in {:.2f} s; writing in the background", step,
             pending_->stall_seconds);
  } else {
    work();
    wait();
  }
}

void CheckpointManager::poll() {
  if (!pending_ || !pending_->done) return;
  Pending& p = *pending_;
  if (!p.joined) {
    if (p.thread.joinable()) p.thread.join();
    p.joined = true;
  }
  // A failed part is reported by wait(), where every rank learns of it together.
  if (p.error || p.finalize_error) return;
  // Rank 0 makes the checkpoint visible as soon as every rank's part is on disk, without a
  // collective; wait() at the next save or at exit sees it done.
  if (rank_ == 0 && !p.finalized && rank_parts_complete(p.tmp, world_size_)) {
    try {
      finalize_pending();
    } catch (...) {
      p.finalize_error = std::current_exception();
    }
  }
}

void CheckpointManager::wait() {
  if (!in_flight_) return;
  in_flight_ = false;
  Pending& p = *pending_;
  if (p.thread.joinable()) p.thread.join();
  p.joined = true;
  // Every rank learns whether any rank's part failed, so all of them stop (or go on) together.
  std::exception_ptr error = std::exchange(p.error, nullptr);
  int failed = first_failed_rank(error != nullptr);
  if (failed < 0) {
    if (rank_ == 0 && !p.finalized && !p.finalize_error) {
      try {
        finalize_pending();
      } catch (...) {
        p.finalize_error = std::current_exception();
      }
    }
    error = std::exchange(p.finalize_error, nullptr);
    failed = first_failed_rank(error != nullptr);  // and the checkpoint visible, for every rank
  }
  const std::string tmp = p.tmp;
  const int64_t step = p.step;
  pending_.reset();
  if (failed >= 0) save_failed(tmp, step, error, failed);
}

int CheckpointManager::first_failed_rank(bool failed) {
  if (!flag_.defined()) {
    flag_ = Tensor::empty(Shape{1}, DType::kI64, backend_.allocator());
    host_flag_ = Tensor::empty(Shape{1}, DType::kI64, backend_.host_staging_allocator());
  }
  Stream& s = backend_.stream(0);
  // The lowest failed rank wins: -(rank + 1) under max is the smallest rank.
  host_flag_.data<int64_t>()[0] =
      failed ? -(int64_t(rank_) + 1) : std::numeric_limits<int64_t>::min();
  backend_.copy(flag_.raw(), host_flag_.raw(), 8, CopyKind::kHostToDevice, s);
  world_.all_reduce(flag_, ReduceOp::kMax, s);
  backend_.copy(host_flag_.raw(), flag_.raw(), 8, CopyKind::kDeviceToHost, s);
  // Host sync: whether the save failed anywhere decides what every rank does next.
  s.synchronize();
  const int64_t v = host_flag_.data<int64_t>()[0];
  return v == std::numeric_limits<int64_t>::min() ? -1 : int(-v - 1);
}

void CheckpointManager::save_failed(const std::string& tmp, int64_t step, std::exception_ptr error,
                                    int rank) {
  std::string why =
      fmt::format("rank {} could not write its part (its own error names the file)", rank);
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // No rank writes any more (every one has passed the agreement): the partial save goes, so no
  // later run mistakes it for a checkpoint (it never had an index, and never was step-N).
  if (rank_ == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  world_.barrier();
  const std::string kept = latest_complete();
  const std::string previous =
      kept.empty() ? "there is no earlier checkpoint" : fmt::format("{} is intact", kept);
  if (options_.continue_on_save_error) {
    log_warn(
        "checkpoint: the save of step {} failed: {}; its partial folder was removed and {}; "
        "training goes on and saves again at the next interval ([checkpoint] "
        "continue_on_save_error)",
        step, why, previous);
    return;
  }
  MT_THROW(IoError,
           "checkpoint: the save of step {} failed: {}; its partial folder was removed and {}. "
           "Free space or fix the disk and resume, or set [checkpoint] continue_on_save_error = "
           "true to keep training through failed saves",
           step, why, previous);
}

void CheckpointManager::finalize_pending() {
  Pending& p = *pending_;
  double write_seconds = 0;
  const CheckpointIndex ix =
      finalize_checkpoint(p.tmp, p.final_dir, world_size_, p.head,
                          checkpoint_tensor_names(plan_, p.model_only), &write_seconds);
  p.finalized = true;
  const double total = double(ix.total_bytes());
  log_info(
      "checkpoint: step {} saved to {} ({}{}), snapshot {:.2f} s (stall), write {:.2f} s, {} at "
      "{}/s; visible {:.2f} s after the snapshot",
      p.step, p.final_dir, options_.async() ? "async" : "sync",
      p.model_only ? fmt::format(", model only, {}", file_dtype_name(options_.export_dtype)) : "",
      p.stall_seconds, write_seconds, human_bytes(total),
      human_bytes(write_seconds > 0 ? total / write_seconds : 0.0), seconds_since(p.written_from));
  if (options_.keep_latest_k > 0) {
    std::vector<int64_t> steps = list_checkpoints(options_.folder);
    for (size_t i = 0; i + size_t(options_.keep_latest_k) < steps.size(); ++i) {
      std::error_code ec;
      fs::remove_all(step_dir(steps[i]), ec);
      if (ec)
        log_warn("checkpoint: cannot remove {} (keep_latest_k {}): {}", step_dir(steps[i]),
                 options_.keep_latest_k, ec.message());
    }
  }
}

}  // namespace meshtrain
