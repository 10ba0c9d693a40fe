// Logging: info lines go to stdout on rank 0 only (every rank when MESHTRAIN_LOG_ALL_RANKS=1);
// warnings and errors go to stderr on every rank, prefixed with the rank.
#pragma once

#include <fmt/format.h>

#include <string>

namespace meshtrain {

void set_log_rank(int rank, int world_size);
int log_rank();
bool log_enabled_here();

void log_line(const std::string& line);          // rank-0 (or all) stdout, flushed
void log_warning_line(const std::string& line);  // every rank, stderr

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled_here()) log_line(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_warning_line(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace meshtrain
