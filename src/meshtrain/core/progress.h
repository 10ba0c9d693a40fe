// Progress of long work (loading data, tokenizing, initialising parameters): on a terminal a live
// line with done/total, rate and time left; otherwise one plain line every few seconds. Work that
// ends before the first report prints nothing, so short runs and tests keep their output.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace meshtrain {

enum class ProgressUnit { kCount, kBytes };

struct ProgressOptions {
  ProgressUnit unit = ProgressUnit::kCount;
  // Seconds between reports; <= 0 = 0.25 s on a terminal, 10 s otherwise.
  double interval_seconds = 0;
  // Nothing is shown before this much time has passed.
  double quiet_seconds = 2.0;
  // -1 = this rank logs (core/logging.h); 0 = never prints; 1 = always.
  int enabled = -1;
  // -1 = isatty(stream); 0 = plain lines; 1 = live line (tests force either).
  int live = -1;
  std::FILE* stream = nullptr;  // nullptr = stderr
};

class Progress {
 public:
  // `total` <= 0 = unknown (no percentage, no time left).
  Progress(std::string label, int64_t total, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Thread-safe; reports when the interval has passed.
  void add(int64_t n);
  void set_total(int64_t total);
  // The summary line ("... 4.56 MB in 1.3s, 3.51 MB/s"), only when a report was shown. Idempotent.
  void finish();

  int64_t done() const { return done_.load(std::memory_order_relaxed); }
  bool shown() const { return shown_; }

  // "tokenizing: 1.23 MB / 4.56 MB (27%), 3.40 MB/s, 1s left" (exposed for tests).
  static std::string format_report(const std::string& label, int64_t done, int64_t total,
                                   double seconds, ProgressUnit unit);
  static std::string format_summary(const std::string& label, int64_t done, double seconds,
                                    ProgressUnit unit);
  static std::string format_duration(double seconds);             // "<1s", "42s", "3m05s", "2h07m"
  static std::string format_amount(double v, ProgressUnit unit);  // "1.23 MB", "4.56M", "812"

 private:
  void report(bool final);
  double seconds() const;

  std::string label_;
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> total_;
  ProgressOptions opt_;
  bool enabled_ = false, live_ = false, shown_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::atomic<double> next_report_;
  std::mutex print_mu_;
  size_t last_width_ = 0;
};

}  // namespace meshtrain
