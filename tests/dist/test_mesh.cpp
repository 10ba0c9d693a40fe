// DeviceMesh over MPI: for every layout of this world size, every named group's communicator
// has exactly the members an independent enumeration of the coordinates predicts, in rank
// order; plus the brief's named 8-rank layouts, describe(), degree-1 groups and errors.
#include <gtest/gtest.h>

#include <array>
#include <map>

#include "dist_util.h"
#include "meshtrain/core/check.h"
#include "meshtrain/parallel/mesh.h"

using namespace meshtrain;
using dist::nranks;
using dist::rank;
using dist::stream;
using dist::world;

namespace {

ParallelDims layout(int R, int S, int C, int T, int E = 1, int U = 1) {
  ParallelDims d;
  d.dp_replicate = R;
  d.dp_shard = S;
  d.cp = C;
  d.tp = T;
  d.ep = E;
  d.etp = U;
  d.world = R * S * C * T;
  return d;
}

// Coordinates by enumeration in nesting order (not through MeshLayout): index 0..3 dense
// (dp_replicate, dp_shard, cp, tp), 4..6 expert (efsdp, ep, etp).
std::vector<std::array<int, 7>> enumerate(const ParallelDims& d) {
  std::vector<std::array<int, 7>> c(size_t(d.world));
  int q = 0;
  for (int r = 0; r < d.dp_replicate; ++r)
    for (int s = 0; s < d.dp_shard; ++s)
      for (int k = 0; k < d.cp; ++k)
        for (int t = 0; t < d.tp; ++t, ++q) c[size_t(q)] = {r, s, k, t, 0, 0, 0};
  const int F = d.dp_shard * d.cp * d.tp / (d.ep * d.etp);
  q = 0;
  for (int r = 0; r < d.dp_replicate; ++r)
    for (int f = 0; f < F; ++f)
      for (int e = 0; e < d.ep; ++e)
        for (int u = 0; u < d.etp; ++u, ++q) {
          c[size_t(q)][4] = f;
          c[size_t(q)][5] = e;
          c[size_t(q)][6] = u;
        }
  return c;
}

// For each group, the coordinates that may differ inside it.
const std::map<std::string, std::vector<int>>& free_coords() {
  static const std::map<std::string, std::vector<int>> m{
      {"world", {0, 1, 2, 3}},
      {"dp_replicate", {0}},
      {"dp_shard", {1}},
      {"cp", {2}},
      {"tp", {3}},
      {"fsdp", {1, 2}},
      {"dp", {0, 1}},
      {"loss", {0, 1, 2}},
      {"ep", {5}},
      {"efsdp", {4}},
      {"etp", {6}},
      {"edp", {0, 4}},
  };
  return m;
}

std::vector<int> expected_members(const std::vector<std::array<int, 7>>& c,
                                  const std::string& group, int me) {
  const auto& fr = free_coords().at(group);
  // A group lives in one coordinate system: dense (0..3) or expert (0, 4, 5, 6).
  bool expert = std::any_of(fr.begin(), fr.end(), [](int i) { return i >= 4; });
  const std::vector<int> system =
      expert ? std::vector<int>{0, 4, 5, 6} : std::vector<int>{0, 1, 2, 3};
  std::vector<int> out;
  for (int q = 0; q < int(c.size()); ++q) {
    bool same = true;
    for (int i : system) {
      bool is_free = std::find(fr.begin(), fr.end(), i) != fr.end();
      if (!is_free && c[size_t(q)][size_t(i)] != c[size_t(me)][size_t(i)]) same = false;
    }
    if (same) out.push_back(q);
  }
  return out;
}

void check_mesh(const ParallelDims& d) {
  DeviceMesh mesh(world(), d);
  auto c = enumerate(mesh.dims());
  EXPECT_EQ(free_coords().size(), all_mesh_groups().size());
  for (MeshGroup group : all_mesh_groups()) {
    const std::string name = mesh_group_name(group);
    auto want = expected_members(c, name, rank());
    Communicator& g = mesh.comm(group);
    int index = int(std::find(want.begin(), want.end(), rank()) - want.begin());
    EXPECT_EQ(g.name(), name);
    EXPECT_EQ(g.size(), int(want.size())) << name << " in " << mesh.dims().to_string();
    EXPECT_EQ(mesh.size(group), int(want.size())) << name;
    EXPECT_EQ(g.rank(), index) << name;
    EXPECT_EQ(mesh.coord(group), index) << name;
    EXPECT_EQ(dist::members(g), want) << name << " in " << mesh.dims().to_string();
  }
}

std::vector<ParallelDims> all_layouts(int world_size) {
  std::vector<ParallelDims> out;
  for (int R = 1; R <= world_size; ++R)
    for (int S = 1; S <= world_size; ++S)
      for (int C = 1; C <= world_size; ++C)
        for (int T = 1; T <= world_size; ++T) {
          if (R * S * C * T != world_size) continue;
          for (int U : {1, T}) {
            int pool = U == T && T > 1 ? S * C : S * C * T;
            for (int E = 1; E <= pool; ++E)
              if (pool % E == 0) out.push_back(layout(R, S, C, T, E, U));
            if (T == 1) break;  // U == T == 1 already done
          }
        }
  return out;
}

}  // namespace

TEST(DistMesh, EveryLayoutOfThisWorldMatchesEnumeration) {
  auto layouts = all_layouts(nranks());
  EXPECT_FALSE(layouts.empty());
  for (const auto& d : layouts) check_mesh(d);
  if (rank() == 0) std::printf("[dist] checked %zu mesh layouts\n", layouts.size());
}

TEST(DistMesh, NamedEightRankLayouts) {
  if (nranks() != 8) GTEST_SKIP() << "layouts need 8 ranks";
  {
    DeviceMesh m(world(), layout(2, 2, 1, 2));  // dp_replicate 2 × dp_shard 2 × tp 2
    if (rank() == 5) {
      EXPECT_EQ(dist::members(m.comm(MeshGroup::kTp)), (std::vector<int>{4, 5}));
      EXPECT_EQ(dist::members(m.comm(MeshGroup::kFsdp)), (std::vector<int>{5, 7}));
      EXPECT_EQ(dist::members(m.comm(MeshGroup::kDpReplicate)), (std::vector<int>{1, 5}));
      EXPECT_EQ(dist::members(m.comm(MeshGroup::kDp)), (std::vector<int>{1, 3, 5, 7}));
    } else {
      for (MeshGroup g :
           {MeshGroup::kTp, MeshGroup::kFsdp, MeshGroup::kDpReplicate, MeshGroup::kDp})
        dist::members(m.comm(g));
    }
    EXPECT_STREQ(m.dims().mode_name(), "hybrid_shard");
  }
  {
    DeviceMesh m(world(), layout(1, 4, 1, 2, 4, 1));  // ep 4 over tp 2 × dp_shard 2, etp 1
    EXPECT_EQ(m.size(MeshGroup::kEp), 4);
    EXPECT_EQ(m.size(MeshGroup::kEfsdp), 2);
    EXPECT_EQ(m.size(MeshGroup::kEtp), 1);
    EXPECT_EQ(m.coord(MeshGroup::kEp), rank() % 4);
    EXPECT_EQ(m.coord(MeshGroup::kEfsdp), rank() / 4);
    auto ep = dist::members(m.comm(MeshGroup::kEp));
    EXPECT_EQ(ep.front(), rank() / 4 * 4);  // contiguous ranks
  }
  {
    DeviceMesh m(world(), layout(1, 4, 1, 2, 2, 2));  // ep 2, etp 2 = tp
    EXPECT_EQ(dist::members(m.comm(MeshGroup::kEtp)), dist::members(m.comm(MeshGroup::kTp)));
    EXPECT_EQ(m.coord(MeshGroup::kEp), (rank() / 2) % 2);
    EXPECT_EQ(m.size(MeshGroup::kEdp), 2);
  }
}

TEST(DistMesh, DegreeOneGroupsAreRealCommunicators) {
  DeviceMesh m(world(), layout(1, nranks(), 1, 1));
  for (MeshGroup g :
       {MeshGroup::kTp, MeshGroup::kCp, MeshGroup::kDpReplicate, MeshGroup::kEp, MeshGroup::kEtp}) {
    Communicator& c = m.comm(g);
    EXPECT_EQ(c.size(), 1) << g;
    Tensor t = Tensor::from_vector<float>({float(rank()) + 0.5f}, Shape{1});
    c.all_reduce(t, ReduceOp::kSum, stream());
    EXPECT_EQ(t.data<float>()[0], float(rank()) + 0.5f) << g;
    Tensor in = Tensor::from_vector<int32_t>({1, 2, 3}, Shape{3});
    Tensor out = Tensor::empty(Shape{4}, DType::kI32);
    c.all_to_all_v(in, {2}, out, {2}, stream());
    EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 0, 0})) << g;
  }
  EXPECT_EQ(m.size(MeshGroup::kFsdp), nranks());
  // dims.world = 0 is filled in from the communicator.
  ParallelDims unset;
  DeviceMesh m2(world(), unset);
  EXPECT_EQ(m2.dims().world, nranks());
  EXPECT_EQ(m2.dims().dp_shard, nranks());
}

TEST(DistMesh, DescribeListsEveryGroup) {
  DeviceMesh m(world(), layout(1, nranks(), 1, 1));
  std::string d = m.describe();
  if (rank() == 0) std::printf("%s\n", d.c_str());
  EXPECT_NE(d.find(fmt::format("device mesh: {} ranks", nranks())), std::string::npos) << d;
  for (MeshGroup g : all_mesh_groups())
    EXPECT_NE(d.find("  " + std::string(mesh_group_name(g)) + " "), std::string::npos) << g << "\n"
                                                                                       << d;
  EXPECT_NE(d.find(fmt::format("{:<14}{:>6}{:>7}  dp_shard×cp", "fsdp", nranks(), rank())),
            std::string::npos)
      << d;
}

TEST(DistMesh, ErrorsAreClear) {
  DeviceMesh m(world(), layout(1, nranks(), 1, 1));
  try {
    m.comm(parse_mesh_group("pipeline"));
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("unknown mesh group 'pipeline' (known: world, dp_replicate"),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(m.coord(parse_mesh_group("pp")), ValueError);
  ParallelDims wrong = layout(1, nranks() + 1, 1, 1);
  try {
    DeviceMesh bad(world(), wrong);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message(), fmt::format("device mesh: parallelism was resolved for world size {}, "
                                       "but communicator 'world' has {} ranks",
                                       nranks() + 1, nranks()));
  }
  ParallelDims mismatch;
  mismatch.tp = nranks() + 1;
  mismatch.dp_shard = 1;
  EXPECT_THROW(DeviceMesh(world(), mismatch), ConfigError);
}
