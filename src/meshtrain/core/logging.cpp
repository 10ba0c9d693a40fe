// Rank-aware log sinks (see logging.h).
#include "meshtrain/core/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace meshtrain {
namespace {
int g_rank = 0;
int g_world = 1;
bool all_ranks() {
  const char* v = std::getenv("MESHTRAIN_LOG_ALL_RANKS");
  return v && std::strcmp(v, "1") == 0;
}
}  // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }
bool log_enabled_here() { return g_rank == 0 || all_ranks(); }

void log_line(const std::string& line) {
  if (g_world > 1 && all_ranks())
    std::fprintf(stdout, "[rank %d] %s\n", g_rank, line.c_str());
  else
    std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void log_warning_line(const std::string& line) {
  if (g_world > 1)
    std::fprintf(stderr, "[rank %d] warning: %s\n", g_rank, line.c_str());
  else
    std::fprintf(stderr, "warning: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace meshtrain
