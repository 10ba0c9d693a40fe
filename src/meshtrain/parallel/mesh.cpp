// Mesh layout arithmetic and group communicators. A group selects some dims of one of the two
// coordinate systems (dense or expert); its index is the mixed-radix number of the selected
// coordinates and its color that of the others, so one MPI_Comm_split per group builds it.
#include "meshtrain/parallel/mesh.h"

#include <array>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

struct GroupSpec {
  MeshGroup group;
  bool expert;               // coordinates (dp_replicate, efsdp, ep, etp) instead of dense
  std::array<bool, 4> dims;  // which of the four coordinates vary inside the group
};

// Indexed by MeshGroup (creation order; also the order describe() prints).
constexpr GroupSpec kGroups[kNumMeshGroups] = {
    {MeshGroup::kWorld, false, {true, true, true, true}},
    {MeshGroup::kDpReplicate, false, {true, false, false, false}},
    {MeshGroup::kDpShard, false, {false, true, false, false}},
    {MeshGroup::kCp, false, {false, false, true, false}},
    {MeshGroup::kTp, false, {false, false, false, true}},
    {MeshGroup::kFsdp, false, {false, true, true, false}},
    {MeshGroup::kDp, false, {true, true, false, false}},
    {MeshGroup::kLoss, false, {true, true, true, false}},
    {MeshGroup::kEp, true, {false, false, true, false}},
    {MeshGroup::kEfsdp, true, {false, true, false, false}},
    {MeshGroup::kEtp, true, {false, false, false, true}},
    {MeshGroup::kEdp, true, {true, true, false, false}},
};
constexpr const char* kDenseDims[] = {"dp_replicate", "dp_shard", "cp", "tp"};
constexpr const char* kExpertDims[] = {"dp_replicate", "efsdp", "ep", "etp"};

constexpr bool specs_in_enum_order() {
  for (int i = 0; i < kNumMeshGroups; ++i)
    if (int(kGroups[i].group) != i) return false;
  return true;
}
static_assert(specs_in_enum_order(), "kGroups must list the groups in MeshGroup order");

const GroupSpec& spec(MeshGroup g) { return kGroups[int(mesh_group_from_int(int(g), "mesh"))]; }

std::array<int, 4> system_sizes(const ParallelDims& d, bool expert) {
  if (expert) return {d.dp_replicate, d.efsdp(), d.ep, d.etp};
  return {d.dp_replicate, d.dp_shard, d.cp, d.tp};
}

std::array<int, 4> system_coords(const MeshLayout::Coords& c, bool expert) {
  if (expert) return {c.dp_replicate, c.efsdp, c.ep, c.etp};
  return {c.dp_replicate, c.dp_shard, c.cp, c.tp};
}

// Mixed-radix number of the coordinates with dims[i] == select, most significant first.
int radix(const std::array<int, 4>& x, const std::array<int, 4>& size,
          const std::array<bool, 4>& dims, bool select) {
  int v = 0;
  for (int i = 0; i < 4; ++i)
    if (dims[size_t(i)] == select) v = v * size[size_t(i)] + x[size_t(i)];
  return v;
}

}  // namespace

MeshLayout::MeshLayout(const ParallelDims& dims) : dims_(dims) {
  MT_CHECK_T(ConfigError, dims_.world >= 1, "device mesh: world size must be set (>= 1), found {}",
             dims_.world);
  dims_.validate();
}

MeshLayout::Coords MeshLayout::coords(int rank) const {
  MT_CHECK(rank >= 0 && rank < dims_.world, "rank {} outside world {}", rank, dims_.world);
  const ParallelDims& d = dims_;
  Coords c;
  c.tp = rank % d.tp;
  c.cp = (rank / d.tp) % d.cp;
  c.dp_shard = (rank / (d.tp * d.cp)) % d.dp_shard;
  c.dp_replicate = rank / (d.tp * d.cp * d.dp_shard);
  c.etp = rank % d.etp;
  c.ep = (rank / d.etp) % d.ep;
  c.efsdp = (rank / (d.etp * d.ep)) % d.efsdp();
  return c;
}

int MeshLayout::dense_rank(int r, int s, int c, int t) const {
  const ParallelDims& d = dims_;
  return ((r * d.dp_shard + s) * d.cp + c) * d.tp + t;
}

int MeshLayout::expert_rank(int r, int f, int e, int u) const {
  const ParallelDims& d = dims_;
  return ((r * d.efsdp() + f) * d.ep + e) * d.etp + u;
}

std::string MeshLayout::group_dims(MeshGroup group) {
  const GroupSpec& g = spec(group);
  std::vector<std::string> parts;
  for (int i = 0; i < 4; ++i)
    if (g.dims[size_t(i)]) parts.emplace_back(g.expert ? kExpertDims[i] : kDenseDims[i]);
  return fmt::format("{}", fmt::join(parts, "×"));
}

int MeshLayout::group_size(MeshGroup group) const {
  const GroupSpec& g = spec(group);
  auto size = system_sizes(dims_, g.expert);
  int n = 1;
  for (int i = 0; i < 4; ++i)
    if (g.dims[size_t(i)]) n *= size[size_t(i)];
  return n;
}

int MeshLayout::group_index(MeshGroup group, int rank) const {
  const GroupSpec& g = spec(group);
  return radix(system_coords(coords(rank), g.expert), system_sizes(dims_, g.expert), g.dims, true);
}

int MeshLayout::group_color(MeshGroup group, int rank) const {
  const GroupSpec& g = spec(group);
  return radix(system_coords(coords(rank), g.expert), system_sizes(dims_, g.expert), g.dims, false);
}

std::vector<int> MeshLayout::group_ranks(MeshGroup group, int rank) const {
  int color = group_color(group, rank);
  std::vector<int> ranks(size_t(group_size(group)), -1);
  for (int q = 0; q < dims_.world; ++q)
    if (group_color(group, q) == color) ranks[size_t(group_index(group, q))] = q;
  return ranks;
}

DeviceMesh::DeviceMesh(Communicator& world, ParallelDims dims)
    : layout_([&] {
        if (dims.world == 0) dims.world = world.size();
        MT_CHECK_T(ConfigError, dims.world == world.size(),
                   "device mesh: parallelism was resolved for world size {}, but communicator "
                   "'{}' has {} ranks",
                   dims.world, world.name(), world.size());
        return MeshLayout(dims);
      }()),
      rank_(world.rank()) {
  for (MeshGroup g : all_mesh_groups()) {
    const char* name = mesh_group_name(g);
    int index = layout_.group_index(g, rank_);
    auto comm = world.split(layout_.group_color(g, rank_), index, name);
    MT_CHECK(comm && comm->size() == layout_.group_size(g) && comm->rank() == index,
             "mesh group '{}': split gave rank {} of {}, layout expects {} of {}", name,
             comm ? comm->rank() : -1, comm ? comm->size() : 0, index, layout_.group_size(g));
    comms_[size_t(g)] = std::move(comm);
  }
}

Communicator& DeviceMesh::comm(MeshGroup group) const {
  return *comms_.at(size_t(spec(group).group));
}

int DeviceMesh::coord(MeshGroup group) const { return layout_.group_index(group, rank_); }

int DeviceMesh::size(MeshGroup group) const { return layout_.group_size(group); }

std::string DeviceMesh::describe() const {
  const ParallelDims& d = dims();
  std::string out =
      fmt::format("device mesh: {} ranks, {}; rank {}\n", d.world, d.mode_name(), rank_);
  out += fmt::format("  {:<14}{:>6}{:>7}  {}\n", "group", "size", "coord", "dims");
  for (const GroupSpec& g : kGroups) {
    if (g.group == MeshGroup::kEp)
      out += fmt::format("  expert mesh (ep={} etp={} efsdp={}):\n", d.ep, d.etp, d.efsdp());
    out += fmt::format("  {:<14}{:>6}{:>7}  {}\n", mesh_group_name(g.group), size(g.group),
                       coord(g.group), MeshLayout::group_dims(g.group));
  }
  out.pop_back();
  return out;
}

}  // namespace meshtrain
