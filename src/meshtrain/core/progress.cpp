// Progress reporter: one clock read per add(); whichever thread crosses the report time prints,
// under a try-lock so workers never wait on the terminal.
#include "meshtrain/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/core/logging.h"

namespace meshtrain {

Progress::Progress(std::string label, int64_t total, ProgressOptions options)
    : label_(std::move(label)), total_(total), opt_(options) {
  if (!opt_.stream) opt_.stream = stderr;
  enabled_ = opt_.enabled < 0 ? log_enabled_here() : opt_.enabled == 1;
  live_ = opt_.live < 0 ? ::isatty(::fileno(opt_.stream)) == 1 : opt_.live == 1;
  if (opt_.interval_seconds <= 0) opt_.interval_seconds = live_ ? 0.25 : 10.0;
  start_ = std::chrono::steady_clock::now();
  next_report_.store(opt_.quiet_seconds);
}

Progress::~Progress() { finish(); }

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::set_total(int64_t total) { total_.store(total, std::memory_order_relaxed); }

void Progress::add(int64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  if (!enabled_) return;
  const double t = seconds();
  if (t < next_report_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(print_mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_ || t < next_report_.load()) return;
  next_report_.store(t + opt_.interval_seconds);
  report(false);
}

void Progress::report(bool final) {
  const double t = seconds();
  const int64_t done = done_.load();
  std::string line = final ? format_summary(label_, done, t, opt_.unit)
                           : format_report(label_, done, total_.load(), t, opt_.unit);
  if (live_) {
    // Pad over the previous line's tail; the final line ends the live line.
    const size_t width = line.size();
    if (width < last_width_) line.append(last_width_ - width, ' ');
    last_width_ = width;
    std::fprintf(opt_.stream, "\r%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(opt_.stream, "%s\n", line.c_str());
  }
  std::fflush(opt_.stream);
  shown_ = true;
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(print_mu_);
  if (finished_) return;
  finished_ = true;
  if (enabled_ && shown_) report(true);
}

std::string Progress::format_amount(double v, ProgressUnit unit) {
  if (unit == ProgressUnit::kBytes) {
    if (v >= 1e9) return fmt::format("{:.2f} GB", v / 1e9);
    if (v >= 1e6) return fmt::format("{:.2f} MB", v / 1e6);
    if (v >= 1e3) return fmt::format("{:.2f} kB", v / 1e3);
    return fmt::format("{} B", int64_t(v));
  }
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f}k", v / 1e3);
  return fmt::format("{}", int64_t(v));
}

std::string Progress::format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 1) return "<1s";
  const int64_t t = int64_t(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}

std::string Progress::format_report(const std::string& label, int64_t done, int64_t total,
                                    double seconds, ProgressUnit unit) {
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  const std::string per_s = format_amount(rate, unit) + "/s";
  if (total <= 0) return fmt::format("{}: {}, {}", label, format_amount(double(done), unit), per_s);
  const double pct = 100.0 * double(std::min(done, total)) / double(total);
  const std::string left =
      rate > 0 ? format_duration(double(std::max<int64_t>(total - done, 0)) / rate) : "?";
  return fmt::format("{}: {} / {} ({:.0f}%), {}, {} left", label, format_amount(double(done), unit),
                     format_amount(double(total), unit), pct, per_s, left);
}

std::string Progress::format_summary(const std::string& label, int64_t done, double seconds,
                                     ProgressUnit unit) {
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  return fmt::format("{}: {} in {}, {}/s", label, format_amount(double(done), unit),
                     format_duration(seconds), format_amount(rate, unit));
}

}  // namespace meshtrain
