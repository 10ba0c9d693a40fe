// Typed errors: formats "[rank R] message (file:line)" once, at construction.
#include "meshtrain/core/check.h"

#include <atomic>
#include <cstring>

namespace meshtrain {
namespace {
std::atomic<int> g_error_rank{-1};

std::string short_file(const char* file) {
  const char* p = std::strstr(file, "src/meshtrain/");
  return p ? std::string(p + 4) : std::string(file);
}
}  // namespace

void set_error_rank(int rank) { g_error_rank = rank; }
int error_rank() { return g_error_rank; }

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInternal: return "internal error";
    case ErrorKind::kConfig: return "config error";
    case ErrorKind::kShape: return "shape error";
    case ErrorKind::kValue: return "value error";
    case ErrorKind::kIo: return "io error";
    case ErrorKind::kComm: return "communication error";
    case ErrorKind::kCuda: return "cuda error";
    case ErrorKind::kData: return "data error";
  }
  return "error";
}

static std::string compose(ErrorKind kind, const std::string& message, const std::string& loc) {
  int rank = g_error_rank;
  std::string prefix = rank >= 0 ? fmt::format("[rank {}] ", rank) : std::string();
  return fmt::format("{}{}: {} ({})", prefix, error_kind_name(kind), message, loc);
}

Error::Error(ErrorKind kind, std::string message, const char* file, int line)
    : std::runtime_error(compose(kind, message, fmt::format("{}:{}", short_file(file), line))),
      kind_(kind),
      message_(std::move(message)),
      location_(fmt::format("{}:{}", short_file(file), line)) {}

}  // namespace meshtrain
