// Backend registry: backends compiled into this build register a factory by name.
#include "meshtrain/runtime/backend.h"

#include <map>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {
std::map<std::string, BackendFactory>& factories() {
  static std::map<std::string, BackendFactory> f;
  return f;
}
}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
  factories()[name] = std::move(factory);
}

bool backend_available(const std::string& name) { return factories().count(name) > 0; }

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (auto& [k, v] : factories()) names.push_back(k);
  return names;
}

std::unique_ptr<Backend> create_backend(const std::string& name, int local_index) {
  auto it = factories().find(name);
  MT_CHECK_T(ConfigError, it != factories().end(),
             "device '{}' is not available in this build: expected one of [{}]{}", name,
             fmt::join(available_backends(), ", "),
             name == "cuda" ? " (rebuild with nvcc on the PATH to get the CUDA backend)" : "");
  return it->second(local_index);
}

}  // namespace meshtrain
