// Mesh group names: the one table from enum to text and back.
#include "meshtrain/core/mesh_group.h"

#include <ostream>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {
constexpr const char* kNames[kNumMeshGroups] = {"world", "dp_replicate", "dp_shard", "cp",
                                                "tp",    "fsdp",         "dp",       "loss",
                                                "ep",    "efsdp",        "etp",      "edp"};
}  // namespace

const std::array<MeshGroup, kNumMeshGroups>& all_mesh_groups() {
  static const std::array<MeshGroup, kNumMeshGroups> all = [] {
    std::array<MeshGroup, kNumMeshGroups> a{};
    for (int i = 0; i < kNumMeshGroups; ++i) a[size_t(i)] = MeshGroup(i);
    return a;
  }();
  return all;
}

const char* mesh_group_name(MeshGroup g) {
  const int i = int(g);
  return i >= 0 && i < kNumMeshGroups ? kNames[i] : "?";
}

std::optional<MeshGroup> find_mesh_group(std::string_view name) {
  for (int i = 0; i < kNumMeshGroups; ++i)
    if (name == kNames[i]) return MeshGroup(i);
  return std::nullopt;
}

MeshGroup parse_mesh_group(std::string_view name) {
  std::optional<MeshGroup> g = find_mesh_group(name);
  MT_CHECK_T(ValueError, g.has_value(), "unknown mesh group '{}' (known: {})", name,
             fmt::join(kNames, ", "));
  return *g;
}

MeshGroup mesh_group_from_int(int64_t value, std::string_view what) {
  MT_CHECK_T(ValueError, value >= 0 && value < kNumMeshGroups,
             "{}: expected a mesh group (0..{}), found {}", what, kNumMeshGroups - 1, value);
  return MeshGroup(value);
}

std::string mesh_group_list(const std::vector<MeshGroup>& groups) {
  return fmt::format("{}", fmt::join(groups, ","));
}

std::ostream& operator<<(std::ostream& os, MeshGroup g) { return os << mesh_group_name(g); }

}  // namespace meshtrain
