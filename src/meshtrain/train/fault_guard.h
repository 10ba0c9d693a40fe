// FaultGuard: what the step loop does about faults that are not bugs. Signals (SIGTERM, SIGINT, and
// SIGUSR2, which mpirun forwards) ask every rank to stop after the step they agree on; non-finite
// losses and gradient norms stop the run or skip the update ([training] skip_nonfinite_steps);
// the collective watchdog gets the step; [debug] inject_* keys plant stalls and NaNs for tests.
// Rule: every decision that changes what ranks do next is agreed over the world communicator,
// so all ranks take it at the same step.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/checkpoint/manager.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain {

// A non-finite loss or gradient norm with skipping off, or too many skipped steps in a row.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& msg, const char* file, int line)
      : Error(ErrorKind::kValue, msg, file, line) {}
};

class FaultGuard {
 public:
  // Installs the signal handlers (restored by the destructor) and starts the collective
  // watchdog with the [comm] timeouts, its status files under <dump_folder>/.ranks.
  FaultGuard(const JobConfig& cfg, Backend& backend, Communicator& world);
  ~FaultGuard();
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;

  // At the start of step `step` (1-based): tells the watchdog; [debug] inject_stall_* stalls here.
  void begin_step(int64_t step);
  // After the micro-batches, before the optimizer: [debug] inject_nan_* poisons a gradient, and
  // [debug] find_nonfinite_gradient finds the first parameter whose gradient is not finite.
  void before_optimizer(int64_t step, const ParamStore& store);
  // After the optimizer (its kernels skip the update when the norm is non-finite). Returns true
  // when the step was skipped; throws NonFiniteError when the run must stop (naming the latest
  // checkpoint, which no non-finite step ever replaces).
  bool after_optimizer(int64_t step, double loss, double grad_norm,
                       const CheckpointManager& checkpoints);
  // One tiny all-reduce per step: true on every rank once any rank got a stop signal.
  bool stop_agreed();
  // The signal that stopped the run (SIGTERM, ...), 0 when none.
  int stop_signal() const { return agreed_signal_; }
  int64_t skipped_steps() const { return skipped_total_; }

 private:
  int64_t agree_max(int64_t v);

  const JobConfig& cfg_;
  Backend& backend_;
  Communicator& world_;
  int rank_ = 0;
  Tensor flag_, host_flag_;
  int agreed_signal_ = 0;
  int64_t skipped_total_ = 0, skipped_in_a_row_ = 0;
  std::string first_nonfinite_grad_;  // [debug] find_nonfinite_gradient, this step
};

// "SIGTERM", "SIGINT", ... for the log line.
const char* signal_name(int sig);

}  // namespace meshtrain
