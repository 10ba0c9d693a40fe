// MeshGroup: the typed identity of a named mesh group (torchtitan's mesh dim names). Layers
// below parallel/ (the IR's collective attrs, the executor's communicators, the passes' streams)
// carry the enum; names exist only at the edges: parse_mesh_group reads one from text once,
// mesh_group_name writes one for logs, dumps and errors. parallel/mesh.h defines the ranks.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Creation order of the device mesh (parallel/mesh.cpp splits the groups in this order).
enum class MeshGroup : uint8_t {
  kWorld,        // all ranks
  kDpReplicate,  // dense dims, one each
  kDpShard,
  kCp,
  kTp,
  kFsdp,  // dp_shard×cp: dense parameter sharding
  kDp,    // dp_replicate×dp_shard: data loading
  kLoss,  // dp_replicate×dp_shard×cp: token counts of the loss
  kEp,    // expert dims, one each
  kEfsdp,
  kEtp,
  kEdp,  // dp_replicate×efsdp: expert gradient reduction
};
constexpr int kNumMeshGroups = 12;

// Every group, in the order above.
const std::array<MeshGroup, kNumMeshGroups>& all_mesh_groups();
const char* mesh_group_name(MeshGroup g);  // "dp_replicate", ...
// nullopt for a name that is no group.
std::optional<MeshGroup> find_mesh_group(std::string_view name);
// ValueError "unknown mesh group 'pp' (known: world, dp_replicate, ...)" for anything else.
MeshGroup parse_mesh_group(std::string_view name);
// A group stored as an integer (a graph attribute); ValueError naming `what` when out of range.
MeshGroup mesh_group_from_int(int64_t value, std::string_view what);
// "fsdp,tp" (reduction order kept); "" for none.
std::string mesh_group_list(const std::vector<MeshGroup>& groups);
std::ostream& operator<<(std::ostream& os, MeshGroup g);  // the name (test messages)

}  // namespace meshtrain

template <>
struct fmt::formatter<meshtrain::MeshGroup> : fmt::formatter<std::string_view> {
  auto format(meshtrain::MeshGroup g, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(meshtrain::mesh_group_name(g), ctx);
  }
};
