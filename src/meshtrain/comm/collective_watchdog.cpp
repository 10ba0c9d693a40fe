// The collective watchdog (see the header): the in-flight record, the status files, the thread.
#include "meshtrain/comm/collective_watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "meshtrain/core/logging.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;
// The status a rank's watchdog leaves when it ends the process.
constexpr const char* kGaveUp = "gave_up";

struct InFlight {
  std::mutex mu;
  int depth = 0;  // nested scopes (a collective made of collectives) count as the outer one
  std::string op, group;
  Clock::time_point since;
  uint64_t begun = 0;  // collectives begun by this process: a peer's progress shows here
};
InFlight& in_flight() {
  static auto* f = new InFlight;  // never destroyed: the thread may outlive static teardown
  return *f;
}
std::atomic<int64_t> g_step{0};
std::atomic<int> g_signal{0};

std::string host_name() {
  char h[256] = {0};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

std::string status_path(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / fmt::format("rank-{}", rank)).string();
}

struct PeerStatus {
  bool found = false;
  std::string host, op, group;
  long pid = 0;
  int64_t step = 0;
  uint64_t begun = 0, beats = 0;
};

PeerStatus read_status(const std::string& path) {
  PeerStatus s;
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return s;
  std::istringstream ls(line);
  s.found = bool(ls >> s.host >> s.pid >> s.step >> s.op >> s.group >> s.begun >> s.beats);
  return s;
}

class Watchdog {
 public:
  void start(const WatchdogOptions& o) {
    stop();
    opts_ = o;
    host_ = host_name();
    if (!opts_.status_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(opts_.status_dir, ec);
    }
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
    thread_.join();
    if (!opts_.status_dir.empty()) ::unlink(status_path(opts_.status_dir, opts_.rank).c_str());
  }

  std::string lost_peers(double wait_s) {
    WatchdogOptions o;
    {
      std::lock_guard<std::mutex> lock(mu_);
      o = opts_;
    }
    const auto until = Clock::now() + std::chrono::duration<double>(wait_s);
    for (;;) {
      bool lost = false;
      const std::string peers = describe_peers(o.status_dir, o.rank, o.world_size, "-", "-", &lost);
      if (lost) return peers;
      if (o.status_dir.empty() || Clock::now() >= until) return "";
      // An error path, not a step: wait for the launcher to reap a killed peer.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  void loop() {
    auto last_write = Clock::time_point{}, last_peer_check = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (running_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (!running_) break;
      const auto now = Clock::now();
      std::string op, group;
      double waited = 0;
      uint64_t begun = 0;
      {
        InFlight& f = in_flight();
        std::lock_guard<std::mutex> l(f.mu);
        if (f.depth > 0) {
          op = f.op, group = f.group;
          waited = std::chrono::duration<double>(now - f.since).count();
        }
        begun = f.begun;
      }
      if (now - last_write >= std::chrono::seconds(1)) {
        write_status(op, group, begun);
        last_write = now;
      }
      if (op.empty()) continue;
      const int64_t step = g_step.load();
      const bool signalled = g_signal.exchange(0) != 0;
      // A collective that waits more than 0.3 s may wait on a dead peer: look every 0.3 s
      // (mpirun tears survivors down about a second after a rank dies).
      if (signalled || (waited > 0.3 && now - last_peer_check >= std::chrono::milliseconds(300))) {
        last_peer_check = now;
        bool lost = false;
        const std::string peers =
            describe_peers(opts_.status_dir, opts_.rank, opts_.world_size, op, group, &lost);
        if (lost)
          report(fmt::format("{} on '{}' at step {} cannot complete: {}", op, group, step, peers));
      }
      const double limit = step <= 1 ? opts_.init_seconds : opts_.train_seconds;
      if (waited > limit) {
        bool lost = false;
        const std::string peers =
            describe_peers(opts_.status_dir, opts_.rank, opts_.world_size, op, group, &lost);
        report(fmt::format(
            "{} on '{}' at step {} did not complete within [comm] {} = {:g} s: {}", op, group, step,
            step <= 1 ? "init_timeout_seconds" : "train_timeout_seconds", limit,
            peers.empty() ? "a peer rank is stalled or lost (no status files to say which)"
                          : peers));
      }
    }
  }

  [[noreturn]] void report(const std::string& what) {
    const std::string line = fmt::format("meshtrain: rank {}: {}; exiting with status {}\n",
                                         opts_.rank, what, kExitCommFailure);
    write_status(kGaveUp, "-", 0);  // peers that see it report at once instead of calling us lost
    // The main thread is blocked inside MPI: no unwinding, no MPI call, just the line and the exit
    // (the launcher ends the other ranks).
    (void)!::write(2, line.data(), line.size());
    std::fflush(nullptr);
    ::_exit(kExitCommFailure);
  }

  void write_status(const std::string& op, const std::string& group, uint64_t begun) {
    if (opts_.status_dir.empty()) return;
    const std::string path = status_path(opts_.status_dir, opts_.rank);
    const std::string tmp = path + ".tmp";
    const std::string text =
        fmt::format("{} {} {} {} {} {} {}\n", host_, long(::getpid()), g_step.load(),
                    op.empty() ? "-" : op, group.empty() ? "-" : group, begun, ++beats_);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;  // the side channel is best effort; the timeout still holds
    const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    ::close(fd);
    if (ok) ::rename(tmp.c_str(), path.c_str());
  }

  WatchdogOptions opts_;
  std::string host_;
  uint64_t beats_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;
  std::thread thread_;
};

Watchdog& watchdog() {
  static auto* w = new Watchdog;
  return *w;
}

}  // namespace

void start_collective_watchdog(const WatchdogOptions& o) { watchdog().start(o); }
void stop_collective_watchdog() { watchdog().stop(); }
void watchdog_set_step(int64_t step) { g_step.store(step); }
void watchdog_note_signal(int sig) { g_signal.store(sig); }
std::string describe_lost_peers(double wait_s) { return watchdog().lost_peers(wait_s); }

CollectiveScope::CollectiveScope(const char* op, const std::string& group) {
  InFlight& f = in_flight();
  std::lock_guard<std::mutex> l(f.mu);
  if (f.depth++ > 0) return;
  f.op = op;
  f.group = group;
  f.since = Clock::now();
  ++f.begun;
}

CollectiveScope::~CollectiveScope() {
  InFlight& f = in_flight();
  std::lock_guard<std::mutex> l(f.mu);
  --f.depth;
}

std::string collective_in_flight() {
  InFlight& f = in_flight();
  std::lock_guard<std::mutex> l(f.mu);
  if (f.depth == 0) return "";
  return fmt::format("{} on '{}' at step {} (waiting {:.1f} s)", f.op, f.group, g_step.load(),
                     std::chrono::duration<double>(Clock::now() - f.since).count());
}

std::string describe_peers(const std::string& status_dir, int rank, int world_size,
                           const std::string& my_op, const std::string& my_group, bool* lost) {
  *lost = false;
  if (status_dir.empty()) return "";
  const std::string here = host_name();
  std::vector<std::string> gone, gave_up, idle, elsewhere;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    const PeerStatus s = read_status(status_path(status_dir, r));
    if (!s.found) continue;
    if (s.op == kGaveUp) {
      gave_up.push_back(fmt::format("rank {} gave up on its own collective", r));
    } else if (s.host == here && ::kill(pid_t(s.pid), 0) != 0 && errno == ESRCH) {
      gone.push_back(
          fmt::format("rank {} (pid {} on {}) is gone: killed or crashed", r, s.pid, s.host));
    } else if (s.op == "-") {
      idle.push_back(
          fmt::format("rank {} (pid {} on {}) is alive but in no collective (at step "
                      "{}): stalled",
                      r, s.pid, s.host, s.step));
    } else if (s.op != my_op || s.group != my_group) {
      elsewhere.push_back(
          fmt::format("rank {} waits in {} on '{}' at step {}", r, s.op, s.group, s.step));
    }
  }
  *lost = !gone.empty() || !gave_up.empty();
  // A dead peer says it all (the others' files may be a second old); else who is where.
  if (!gone.empty()) idle.clear();
  if (*lost) elsewhere.clear();
  std::string out;
  for (const auto* list : {&gone, &gave_up, &idle, &elsewhere})
    for (const std::string& s : *list) out += (out.empty() ? "" : "; ") + s;
  return out;
}

}  // namespace meshtrain
