// ParallelDims validation and MeshLayout rank arithmetic (no MPI): good layouts resolve and
// report the right views; every user-facing error message is asserted word for word.
#include <gtest/gtest.h>

#include <set>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/parallel_dims.h"

using meshtrain::all_mesh_groups;
using meshtrain::ConfigError;
using meshtrain::mesh_group_from_int;
using meshtrain::mesh_group_list;
using meshtrain::mesh_group_name;
using meshtrain::MeshGroup;
using meshtrain::MeshLayout;
using meshtrain::ParallelDims;
using meshtrain::parse_mesh_group;

namespace {

ParallelDims dims(int world, int dp_replicate, int dp_shard, int cp, int tp, int ep = 1,
                  int etp = 1) {
  ParallelDims d;
  d.world = world;
  d.dp_replicate = dp_replicate;
  d.dp_shard = dp_shard;
  d.cp = cp;
  d.tp = tp;
  d.ep = ep;
  d.etp = etp;
  return d;
}

std::string config_error(ParallelDims d) {
  try {
    d.validate();
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "<no error>";
}

}  // namespace

TEST(ParallelDims, ResolvesDpShardFromWhatIsLeft) {
  ParallelDims d = dims(8, 2, -1, 1, 2);
  d.validate();
  EXPECT_EQ(d.dp_shard, 2);
  EXPECT_EQ(d.dp(), 4);
  EXPECT_EQ(d.fsdp(), 2);
  EXPECT_EQ(d.loss(), 4);
  EXPECT_EQ(d.efsdp(), 8 / 2 / 2 * 2);  // dp_shard*cp*tp / (ep*etp) = 4
  EXPECT_STREQ(d.mode_name(), "hybrid_shard");
  EXPECT_TRUE(d.fsdp_enabled());
  EXPECT_TRUE(d.hsdp_enabled());
}

TEST(ParallelDims, DefaultsToFullyShardOverTheWorld) {
  ParallelDims d;
  d.world = 6;
  d.validate();
  EXPECT_EQ(d.dp_shard, 6);
  EXPECT_STREQ(d.mode_name(), "fully_shard");
  EXPECT_EQ(d.to_string(), "dp_replicate=1 dp_shard=6 cp=1 tp=1 ep=1 etp=1 (world 6, fully_shard)");
}

TEST(ParallelDims, ModeNames) {
  ParallelDims a = dims(4, 4, 1, 1, 1);
  a.validate();
  EXPECT_STREQ(a.mode_name(), "replicate");
  EXPECT_FALSE(a.fsdp_enabled());
  ParallelDims b = dims(2, 1, 1, 1, 2);
  b.validate();
  EXPECT_STREQ(b.mode_name(), "none");
  ParallelDims c = dims(4, 1, 1, 2, 2);  // cp alone still shards dense params over fsdp
  c.validate();
  EXPECT_EQ(c.fsdp(), 2);
  EXPECT_STREQ(c.mode_name(), "fully_shard");
  ParallelDims one = dims(1, 1, -1, 1, 1);
  one.validate();
  EXPECT_STREQ(one.mode_name(), "none");
}

TEST(ParallelDims, ExpertLayouts) {
  ParallelDims a = dims(8, 1, 4, 1, 2, 4, 1);  // ep borrows tp ranks
  a.validate();
  EXPECT_EQ(a.efsdp(), 2);
  ParallelDims b = dims(8, 1, 4, 1, 2, 2, 2);  // etp = tp: ep from dp_shard only
  b.validate();
  EXPECT_EQ(b.efsdp(), 2);
  ParallelDims c = dims(8, 1, 2, 2, 2, 8, 1);  // ep spans dp_shard × cp × tp
  c.validate();
  EXPECT_EQ(c.efsdp(), 1);
  ParallelDims d = dims(8, 2, 2, 1, 2, 2, 1);  // ep inside tp × dp_shard of one replica
  d.validate();
  EXPECT_EQ(d.efsdp(), 2);
}

TEST(ParallelDims, ProductMismatchMessage) {
  EXPECT_EQ(config_error(dims(3, 1, 2, 1, 2)),
            "parallelism degrees dp_replicate=1 × dp_shard=2 × cp=1 × tp=2 = 4 do not match "
            "world size 3 (launch with 4 ranks or change [parallelism])");
}

TEST(ParallelDims, UnresolvableDpShardMessage) {
  EXPECT_EQ(config_error(dims(8, 1, -1, 1, 3)),
            "parallelism degrees dp_replicate=1 × cp=1 × tp=3 = 3 do not divide world size 8, "
            "so dp_shard=-1 cannot be resolved (launch with a multiple of 3 ranks or change "
            "[parallelism])");
}

TEST(ParallelDims, DegreeBelowOneMessages) {
  EXPECT_EQ(config_error(dims(4, 1, -1, 1, 0)),
            "parallelism degree tp=0 must be >= 1 (tensor_parallel_degree in [parallelism])");
  EXPECT_EQ(config_error(dims(4, 0, -1, 1, 1)),
            "parallelism degree dp_replicate=0 must be >= 1 (data_parallel_replicate_degree in "
            "[parallelism])");
  EXPECT_EQ(config_error(dims(4, 1, -1, -2, 1)),
            "parallelism degree cp=-2 must be >= 1 (context_parallel_degree in [parallelism])");
  EXPECT_EQ(config_error(dims(4, 1, -1, 1, 1, 0)),
            "parallelism degree ep=0 must be >= 1 (expert_parallel_degree in [parallelism])");
  EXPECT_EQ(config_error(dims(4, 1, -1, 1, 1, 1, 0)),
            "parallelism degree etp=0 must be >= 1 (expert_tensor_parallel_degree in "
            "[parallelism])");
  EXPECT_EQ(config_error(dims(4, 1, 0, 1, 1)),
            "parallelism degree dp_shard=0 must be >= 1, or -1 to use the ranks the other "
            "degrees leave (data_parallel_shard_degree in [parallelism])");
  EXPECT_EQ(config_error(dims(0, 1, -1, 1, 1)), "parallelism: world size must be >= 1, found 0");
}

TEST(ParallelDims, EtpMustBeOneOrTpMessage) {
  EXPECT_EQ(config_error(dims(8, 1, 2, 1, 4, 1, 2)),
            "parallelism degree etp=2 must be 1 or equal to tp=4 (expert_tensor_parallel_degree "
            "in [parallelism], world size 8)");
}

TEST(ParallelDims, EpMustDivideMessages) {
  EXPECT_EQ(config_error(dims(8, 1, 4, 1, 2, 3, 1)),
            "parallelism degree ep=3 must divide dp_shard=4 × cp=1 × tp=2 = 8 (expert "
            "parallelism borrows ranks from dp_shard × cp × tp; world size 8)");
  // With etp == tp, ep may not take tp ranks: ep=4 divides 8 but not dp_shard × cp = 2.
  EXPECT_EQ(config_error(dims(8, 2, 2, 1, 2, 4, 2)),
            "parallelism degree ep=4 must divide dp_shard=2 × cp=1 = 2 (with etp=tp=2, expert "
            "parallelism borrows ranks from dp_shard × cp only; world size 8)");
}

// The layout formulas, checked against an independent nested-loop enumeration.
TEST(MeshLayout, DenseAndExpertFormulas) {
  for (auto d : {dims(8, 2, 2, 1, 2), dims(8, 1, 4, 1, 2, 4, 1), dims(8, 1, 4, 1, 2, 2, 2),
                 dims(12, 1, 2, 3, 2, 3, 1), dims(16, 2, 2, 2, 2, 2, 2)}) {
    MeshLayout L(d);
    const ParallelDims& p = L.dims();
    int rank = 0;
    for (int r = 0; r < p.dp_replicate; ++r)
      for (int s = 0; s < p.dp_shard; ++s)
        for (int c = 0; c < p.cp; ++c)
          for (int t = 0; t < p.tp; ++t, ++rank) {
            auto x = L.coords(rank);
            EXPECT_EQ(L.dense_rank(r, s, c, t), rank);
            EXPECT_EQ(x.dp_replicate, r);
            EXPECT_EQ(x.dp_shard, s);
            EXPECT_EQ(x.cp, c);
            EXPECT_EQ(x.tp, t);
          }
    rank = 0;
    for (int r = 0; r < p.dp_replicate; ++r)
      for (int f = 0; f < p.efsdp(); ++f)
        for (int e = 0; e < p.ep; ++e)
          for (int u = 0; u < p.etp; ++u, ++rank) {
            auto x = L.coords(rank);
            EXPECT_EQ(L.expert_rank(r, f, e, u), rank);
            EXPECT_EQ(x.efsdp, f);
            EXPECT_EQ(x.ep, e);
            EXPECT_EQ(x.etp, u);
            if (p.etp == p.tp) {
              EXPECT_EQ(x.etp, x.tp);  // the etp group is the tp group
            }
          }
  }
}

TEST(MeshLayout, GroupsPartitionTheWorld) {
  MeshLayout L(dims(16, 2, 2, 2, 2, 4, 1));
  for (MeshGroup name : all_mesh_groups()) {
    std::set<int> seen;
    for (int q = 0; q < L.world(); ++q) {
      auto g = L.group_ranks(name, q);
      EXPECT_EQ(int(g.size()), L.group_size(name)) << name;
      EXPECT_EQ(g[size_t(L.group_index(name, q))], q) << name;
      for (size_t i = 1; i < g.size(); ++i) EXPECT_LT(g[i - 1], g[i]) << name;  // rank order
      if (L.group_index(name, q) == 0) seen.insert(g.begin(), g.end());
    }
    EXPECT_EQ(int(seen.size()), L.world()) << name;
  }
}

TEST(MeshLayout, NamedExamples) {
  // 8 ranks: dp_replicate 2 × dp_shard 2 × tp 2; rank 5 = (r 1, s 0, t 1).
  MeshLayout a(dims(8, 2, 2, 1, 2));
  EXPECT_EQ(a.group_ranks(MeshGroup::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kDpShard, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kFsdp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kDpReplicate, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kDp, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kLoss, 5), (std::vector<int>{1, 3, 5, 7}));
  // ep = etp = 1: experts are not tp-sharded, so efsdp spans dp_shard × tp and edp the world.
  EXPECT_EQ(a.group_ranks(MeshGroup::kEfsdp, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(a.group_ranks(MeshGroup::kEdp, 5), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // ep 4, etp 1, tp 2 (dp_shard 4): ep takes consecutive ranks, tp included.
  MeshLayout b(dims(8, 1, 4, 1, 2, 4, 1));
  EXPECT_EQ(b.group_ranks(MeshGroup::kEp, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(b.group_ranks(MeshGroup::kEfsdp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(b.group_ranks(MeshGroup::kEtp, 5), (std::vector<int>{5}));
  EXPECT_EQ(b.group_ranks(MeshGroup::kEdp, 5), (std::vector<int>{1, 5}));
  // ep 2, etp 2 = tp: ep strides over tp groups, etp is the tp group.
  MeshLayout c(dims(8, 1, 4, 1, 2, 2, 2));
  EXPECT_EQ(c.group_ranks(MeshGroup::kEp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(c.group_ranks(MeshGroup::kEfsdp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(c.group_ranks(MeshGroup::kEtp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(c.group_ranks(MeshGroup::kTp, 5), (std::vector<int>{4, 5}));
}

TEST(MeshGroup, NamesRoundTripAndUnknownNamesListTheKnownOnes) {
  for (MeshGroup g : all_mesh_groups()) EXPECT_EQ(parse_mesh_group(mesh_group_name(g)), g);
  EXPECT_EQ(mesh_group_list({MeshGroup::kEfsdp, MeshGroup::kEp}), "efsdp,ep");
  EXPECT_EQ(mesh_group_list({}), "");
  try {
    parse_mesh_group("pp");
    FAIL() << "expected an error";
  } catch (const meshtrain::ValueError& e) {
    EXPECT_EQ(std::string(e.message()),
              "unknown mesh group 'pp' (known: world, dp_replicate, dp_shard, cp, tp, fsdp, dp, "
              "loss, ep, efsdp, etp, edp)");
  }
  try {
    mesh_group_from_int(12, "attribute 'group'");
    FAIL() << "expected an error";
  } catch (const meshtrain::ValueError& e) {
    EXPECT_EQ(std::string(e.message()),
              "attribute 'group': expected a mesh group (0..11), found 12");
  }
}
