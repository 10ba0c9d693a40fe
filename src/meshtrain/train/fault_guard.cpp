// FaultGuard (see the header): signal handlers, the per-step stop agreement, the non-finite policy,
// and the [debug] fault injections.
#include "meshtrain/train/fault_guard.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR2};
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_signals_seen = 0;
volatile sig_atomic_t g_stepping = 0;        // set by the first begin_step
char g_first_line[160], g_second_line[160];  // formatted at install: a handler cannot format
struct sigaction g_previous[3];
int g_guards = 0;  // live FaultGuards (tests nest trainers): the first installs, the last restores

void write_line(const char* s) { (void)!::write(2, s, std::strlen(s)); }

// Async-signal-safe: a flag, a prepared line, the watchdog's atomic, and _exit for the second.
// Before the first step there is no step to finish and nothing new to save: the signal ends the
// rank at once, silently, as it would without a handler. That is also how the other ranks go when
// rank 0 stops on a startup error and mpirun's abort sends them SIGTERM (one error line, not one
// "finishing the current step" line per rank).
void on_stop_signal(int sig) {
  if (!g_stepping) ::_exit(128 + sig);
  const sig_atomic_t seen = g_signals_seen;
  g_signals_seen = seen + 1;
  if (seen == 0) {
    g_stop_signal = sig;
    write_line(g_first_line);
    watchdog_note_signal(sig);
    return;
  }
  write_line(g_second_line);
  ::_exit(128 + sig);
}

}  // namespace

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR2: return "SIGUSR2 (the stop request mpirun forwards)";
    default: return "a signal";
  }
}

FaultGuard::FaultGuard(const JobConfig& cfg, Backend& backend, Communicator& world)
    : cfg_(cfg), backend_(backend), world_(world), rank_(world.rank()) {
  flag_ = Tensor::empty(Shape{1}, DType::kI64, backend_.allocator());
  host_flag_ = Tensor::empty(Shape{1}, DType::kI64, backend_.host_staging_allocator());
  std::snprintf(g_first_line, sizeof(g_first_line),
                "meshtrain: rank %d: stop signal received: finishing the current step, then "
                "saving and exiting (a second signal exits at once)\n",
                rank_);
  std::snprintf(g_second_line, sizeof(g_second_line),
                "meshtrain: rank %d: second stop signal: exiting now, without saving\n", rank_);
  if (g_guards++ == 0) {
    g_stop_signal = 0;
    g_signals_seen = 0;
    g_stepping = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // MPI and file calls the main thread is in go on after the flag
    for (size_t i = 0; i < std::size(kStopSignals); ++i)
      ::sigaction(kStopSignals[i], &sa, &g_previous[i]);
  }
  start_collective_watchdog(
      {.init_seconds = double(cfg_.comm.init_timeout_seconds),
       .train_seconds = double(cfg_.comm.train_timeout_seconds),
       .rank = rank_,
       .world_size = world_.size(),
       .status_dir = (std::filesystem::path(cfg_.job.dump_folder) / ".ranks").string()});
}

FaultGuard::~FaultGuard() {
  stop_collective_watchdog();
  if (--g_guards == 0)
    for (size_t i = 0; i < std::size(kStopSignals); ++i)
      ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

void FaultGuard::begin_step(int64_t step) {
  g_stepping = 1;
  watchdog_set_step(step);
  const DebugSection& d = cfg_.debug;
  if (d.inject_stall_step == step && d.inject_stall_rank == rank_) {
    log_warn("rank {}: [debug] inject_stall_step = {}: stalling here, before any collective", rank_,
             step);
    for (;;) ::pause();  // a stop signal sets its flag and returns here; a second one exits
  }
}

void FaultGuard::before_optimizer(int64_t step, const ParamStore& store) {
  const DebugSection& d = cfg_.debug;
  if (d.inject_nan_step == step && d.inject_nan_rank == rank_) {
    const ParamGroup& g = store.groups().front();
    Tensor nan = Tensor::empty(Shape{1}, g.grad.dtype(), backend_.host_staging_allocator());
    if (g.grad.dtype() == DType::kF64)
      nan.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
    else
      nan.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    backend_.copy(g.grad.raw(), nan.raw(), nan.nbytes(), CopyKind::kHostToDevice,
                  backend_.stream(0));
    backend_.stream(0).synchronize();  // the staging tensor dies at the end of this block
    log_warn("rank {}: [debug] inject_nan_step = {}: a NaN written into the first gradient", rank_,
             step);
  }
  first_nonfinite_grad_.clear();
  if (!d.find_nonfinite_gradient) return;
  // The first parameter, in plan order, whose local gradient slice holds a NaN/Inf, agreed over
  // the ranks (the smallest index any rank found).
  const std::vector<ParamInfo>& params = store.plan().params();
  int64_t found = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < params.size() && found == std::numeric_limits<int64_t>::max(); ++i) {
    if (!params[i].trainable) continue;
    Tensor dev = store.grad(params[i].name);
    Tensor host = Tensor::empty(dev.shape(), dev.dtype(), backend_.host_staging_allocator());
    backend_.copy(host.raw(), dev.raw(), dev.nbytes(), CopyKind::kDeviceToHost, backend_.stream(0));
    // Host sync: [debug] find_nonfinite_gradient reads every gradient (debugging only).
    backend_.stream(0).synchronize();
    for (int64_t k = 0, n = host.numel(); k < n; ++k)
      if (!std::isfinite(host.item_as_double(k))) {
        found = int64_t(i);
        break;
      }
  }
  const int64_t first = -agree_max(-found);
  if (first != std::numeric_limits<int64_t>::max())
    first_nonfinite_grad_ = params[size_t(first)].name;
}

bool FaultGuard::after_optimizer(int64_t step, double loss, double grad_norm,
                                 const CheckpointManager& checkpoints) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    skipped_in_a_row_ = 0;
    return false;
  }
  const std::string what = fmt::format(
      "step {}: {} (loss {}, gradient norm {}){}", step,
      std::isfinite(loss) ? "the gradient norm is not finite" : "the loss is not finite", loss,
      grad_norm,
      first_nonfinite_grad_.empty()
          ? std::string()
          : fmt::format("; the first parameter with a non-finite gradient is {}",
                        first_nonfinite_grad_));
  const std::string last_checkpoint = checkpoints.latest_complete();
  const std::string kept = last_checkpoint.empty()
                               ? std::string("no checkpoint was saved yet")
                               : fmt::format("the last checkpoint {} is intact", last_checkpoint);
  if (!cfg_.training.skip_nonfinite_steps)
    MT_THROW(NonFiniteError,
             "{}. The update was not applied and {}. Set [training] skip_nonfinite_steps = true to "
             "skip such steps and go on{}",
             what, kept,
             cfg_.debug.find_nonfinite_gradient
                 ? ""
                 : ", or [debug] find_nonfinite_gradient = true to name the first parameter whose "
                   "gradient is not finite");
  ++skipped_total_;
  ++skipped_in_a_row_;
  MT_CHECK_T(NonFiniteError, skipped_in_a_row_ < cfg_.training.max_consecutive_skipped_steps,
             "{}: {} non-finite steps in a row reached [training] max_consecutive_skipped_steps = "
             "{}; stopping ({} skipped in all; {})",
             what, skipped_in_a_row_, cfg_.training.max_consecutive_skipped_steps, skipped_total_,
             kept);
  log_warn("{}: update skipped ({} in a row, {} in all; [training] skip_nonfinite_steps)", what,
           skipped_in_a_row_, skipped_total_);
  return true;
}

bool FaultGuard::stop_agreed() {
  if (agreed_signal_ != 0) return true;
  agreed_signal_ = int(agree_max(int64_t(g_stop_signal)));
  return agreed_signal_ != 0;
}

int64_t FaultGuard::agree_max(int64_t v) {
  Stream& s = backend_.stream(0);
  host_flag_.data<int64_t>()[0] = v;
  backend_.copy(flag_.raw(), host_flag_.raw(), 8, CopyKind::kHostToDevice, s);
  world_.all_reduce(flag_, ReduceOp::kMax, s);
  backend_.copy(host_flag_.raw(), flag_.raw(), 8, CopyKind::kDeviceToHost, s);
  // Host sync: the agreed value decides what every rank does next.
  s.synchronize();
  return host_flag_.data<int64_t>()[0];
}

}  // namespace meshtrain
