// The collective watchdog of host-blocking backends (MPI): every collective records what it is
// (op, mesh group, step) while it runs; a thread ends the process with one line when a collective
// outlives [comm] init_timeout_seconds (step <= 1) or train_timeout_seconds, or as soon as a peer
// rank on this host is gone. Rule: the watchdog never calls MPI; it writes one line and _exits
// (status kExitCommFailure), and the launcher tears the other ranks down.
//
// The side channel that names the lost rank: each rank's watchdog rewrites a small status file
// <dir>/rank-R (host, pid, step, the collective it is in) once a second. On a timeout or a signal
// during a collective, the rank reads its peers' files: a peer on this host whose pid is gone is
// "lost"; a live peer that is not in a collective (or whose file stopped changing) is "stalled".
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain {

// Exit statuses of a training process (documented in README, "Faults").
inline constexpr int kExitInterrupted = 3;  // stopped at a signal after a step (checkpoint saved)
inline constexpr int kExitCommFailure = 4;  // a collective timed out or a peer rank was lost

struct WatchdogOptions {
  double init_seconds = 300;   // collectives of start-up and step 1
  double train_seconds = 100;  // collectives of later steps
  int rank = 0, world_size = 1;
  std::string status_dir;  // where rank-R status files go; "" = no side channel
};

// Starts (or restarts with new options) the process's watchdog thread. Idempotent.
void start_collective_watchdog(const WatchdogOptions& o);
void stop_collective_watchdog();  // joins the thread and removes this rank's status file
// The step the main thread is in (named in reports; picks the timeout).
void watchdog_set_step(int64_t step);
// Called from a signal handler (async-signal-safe): the watchdog checks the peers now, and when a
// collective is in flight and a peer is gone, reports it instead of waiting for the timeout.
void watchdog_note_signal(int sig);

// RAII: the collective `op` on communicator `group` is in flight on this thread while it lives.
class CollectiveScope {
 public:
  CollectiveScope(const char* op, const std::string& group);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;
};

// "all_reduce on 'fsdp' at step 12 (waiting 3.2 s)", or "" when no collective is in flight.
std::string collective_in_flight();

// For errors raised outside the watchdog (NCCL's asynchronous errors): "rank 1 (pid 123 on host
// h) is gone: killed or crashed" when a peer's status file names a process of this host that has
// ended, looked for during up to `wait_s` seconds (the launcher may not have reaped it yet); ""
// when no peer is known to be gone or the watchdog has no status files.
std::string describe_lost_peers(double wait_s);

// What the peers' status files say, for the report (exposed for tests): "rank 2 (pid 123 on
// host h) is gone", "rank 1 is not in a collective (at step 4)", or "" when nothing is known.
std::string describe_peers(const std::string& status_dir, int rank, int world_size,
                           const std::string& my_op, const std::string& my_group, bool* lost);

}  // namespace meshtrain
