// Resharding at the store level, every rank of a layout simulated in one process (RankGroups of
// a MeshLayout, as `meshtrain plan` does): save on one layout, load on another, and every master
// and moment equals the same slice of the seeded global tensor, padding zero. Covers uneven FSDP
// padding, TP column/row slices, EP, ETP, dim-1 expert shards, HSDP replicas written once, whole
// buffers, and that a rank reads exactly its own bytes. Plus boxes, runs and tiling checks.
#include <filesystem>

#include "meshtrain/checkpoint/load.h"
#include "meshtrain/checkpoint/save.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/runtime/backend.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::error_message;

constexpr uint64_t kSeed = 11;

struct FakeRank {
  std::unique_ptr<RankGroups> groups;
  Graph graph;
  std::unique_ptr<ParallelPlan> plan;
  std::unique_ptr<ParamStore> store;
};

// Every rank of a layout with the same parameters; `fill`: masters and moments from the seeded
// global tensors (else all zero, to be loaded into).
std::vector<std::unique_ptr<FakeRank>> make_layout(ParallelDims dims, Backend& cpu, bool fill) {
  dims.world = dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp;
  const MeshLayout layout(dims);
  std::vector<std::unique_ptr<FakeRank>> ranks;
  for (int r = 0; r < dims.world; ++r) {
    auto f = std::make_unique<FakeRank>();
    f->groups = std::make_unique<RankGroups>(layout, r);
    f->plan = std::make_unique<ParallelPlan>(PlanConfig{}, f->groups.get());
    Builder b(f->graph);
    ParallelPlan& p = *f->plan;
    const InitSpec n = InitSpec::normal(1.0);
    p.param(b, "tok.weight", {10, 6}, n);  // replicated over tp
    p.param(b, "wq", {8, 6}, n, {.tp = TpStyle::kColwise});
    p.param(b, "wo", {6, 8}, n, {.tp = TpStyle::kRowwise});
    p.param(b, "norm", {7}, n);
    p.param(b, "experts.w1", {4, 8, 6}, n, {.kind = ParamKind::kExpert, .tp = TpStyle::kColwise});
    p.param(b, "experts.w2", {4, 6, 8}, n, {.kind = ParamKind::kExpert, .tp = TpStyle::kRowwise});
    p.buffer(b, "expert_bias", {4}, DType::kF32, n);
    f->store = std::make_unique<ParamStore>(p, cpu);
    if (fill) {
      f->store->initialize(kSeed);
      for (const ParamInfo& q : p.params())
        if (q.trainable) {
          init_local(f->store->exp_avg(q.name), q.global_shape, q.piece, n, kSeed + 1, q.name);
          init_local(f->store->exp_avg_sq(q.name), q.global_shape, q.piece, n, kSeed + 2, q.name);
        }
    }
    ranks.push_back(std::move(f));
  }
  return ranks;
}

ParallelDims dims(int rep, int shard, int tp, int ep, int etp) {
  ParallelDims d;
  d.dp_replicate = rep, d.dp_shard = shard, d.tp = tp, d.ep = ep, d.etp = etp;
  return d;
}

class ReshardTest : public testing::TempDirTest {
 protected:
  std::unique_ptr<Backend> cpu_ = create_backend("cpu", 0);

  // Saves every rank of `from` into dir_/<name>, returns the folder.
  std::string save(const std::vector<std::unique_ptr<FakeRank>>& from, const std::string& name) {
    const std::string tmp = (dir_ / ("." + name + ".tmp")).string(),
                      final_dir = (dir_ / name).string();
    fs::create_directories(tmp);
    const int world = int(from.size());
    for (int r = 0; r < world; ++r) {
      Snapshot snap(*from[size_t(r)]->plan, *from[size_t(r)]->store, *cpu_, r % 2 == 1);
      snap.take(false);
      LoaderPosition lp{.dp_rank = from[size_t(r)]->groups->group_rank(MeshGroup::kDp)};
      write_rank_part(tmp, r, snap, false, std::nullopt, lp, 10);
    }
    CheckpointIndex head;
    head.step = 10;
    head.state.dp_degree = from[0]->groups->group_size(MeshGroup::kDp);
    finalize_checkpoint(tmp, final_dir, world, head, checkpoint_tensor_names(*from[0]->plan, false),
                        nullptr);
    return final_dir;
  }

  // Loads `dir` into every rank of `to` and checks each tensor against a freshly seeded store.
  void load_and_check(const std::string& dir, ParallelDims to) {
    const CheckpointIndex ix = read_checkpoint_index(dir);
    auto got = make_layout(to, *cpu_, false);
    auto want = make_layout(to, *cpu_, true);
    for (size_t r = 0; r < got.size(); ++r) {
      const ParallelPlan& plan = *got[r]->plan;
      check_checkpoint_matches(ix, dir, plan, true);
      const LoadStats st = load_checkpoint_tensors(dir, ix, plan, *got[r]->store, *cpu_, true,
                                                   int(r), int(got.size()));
      int64_t own = 0;  // bytes of this rank's real regions: exactly what it must read
      for (const ParamInfo& p : plan.params()) {
        own += real_region(p).volume() * 4 * (p.trainable ? 3 : 1);
        auto same = [&](const Tensor& a, const Tensor& b, const char* what) {
          EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>())
              << p.name << " " << what << " on rank " << r << " of " << to.to_string();
        };
        same(got[r]->store->master(p.name), want[r]->store->master(p.name), "master");
        if (p.trainable) {
          same(got[r]->store->exp_avg(p.name), want[r]->store->exp_avg(p.name), "exp_avg");
          same(got[r]->store->exp_avg_sq(p.name), want[r]->store->exp_avg_sq(p.name), "exp_avg_sq");
        }
      }
      EXPECT_EQ(st.bytes_read, own) << "rank " << r;
    }
  }
};

TEST_F(ReshardTest, AnyLayoutLoadsAnyOther) {
  // fsdp 3 x tp 2, ep 2: 2 local experts over efsdp 3 -> experts sharded along dim 1 (padded);
  // HSDP 2x2 x tp 2 with ep 2 and etp 2 (experts column/row-sliced); one rank.
  const ParallelDims a = dims(1, 3, 2, 2, 1), b = dims(2, 2, 2, 2, 2), one = dims(1, 1, 1, 1, 1);
  auto ra = make_layout(a, *cpu_, true);
  auto rb = make_layout(b, *cpu_, true);
  auto r1 = make_layout(one, *cpu_, true);
  const std::string da = save(ra, "a"), db = save(rb, "b"), d1 = save(r1, "one");
  // HSDP: the dp_replicate = 1 half holds only replicas and writes no file.
  EXPECT_EQ(read_checkpoint_index(db).files.size(), 4u);
  EXPECT_EQ(read_checkpoint_index(da).files.size(), 6u);
  for (const std::string& d : {da, db, d1})
    for (const ParallelDims& to : {a, b, one}) load_and_check(d, to);
  // A whole tensor read back offline (every slice) is the seeded global tensor.
  const ParamInfo& w2 = r1[0]->plan->info("experts.w2");
  std::vector<double> whole(size_t(w2.global_shape.numel()));
  EXPECT_EQ(
      read_global_tensor(da, read_checkpoint_index(da), "experts.w2", DType::kF64, whole.data()),
      w2.global_shape.numel() * 4);
  const std::vector<float> want = r1[0]->store->master("experts.w2").to_vector<float>();
  for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(whole[i], double(want[i])) << i;
}

TEST(Boxes, IntersectionsAndRuns) {
  Box a{{0, 4}, {4, 4}}, b{{2, 0}, {4, 6}};
  Box c = intersect(a, b);
  EXPECT_EQ(c.lo, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(c.ext, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.to_string(), "[2:4, 4:6]");
  EXPECT_TRUE(intersect(Box{{0}, {3}}, Box{{3}, {2}}).empty());
  // Region [2:4, 4:6] from block a (rows 0..4 of cols 4..8) into block b stored as 4 x 8 (padded).
  std::vector<std::array<int64_t, 3>> runs;
  for_each_run(c, a, {4, 8}, b, [&](int64_t x, int64_t y, int64_t n) {
    runs.push_back({x, y, n});
  });
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], (std::array<int64_t, 3>{2 * 4 + 0, 0 * 8 + 4, 2}));
  EXPECT_EQ(runs[1], (std::array<int64_t, 3>{3 * 4 + 0, 1 * 8 + 4, 2}));
  // Whole trailing dims merge into one run.
  runs.clear();
  Box rows{{1, 0, 0}, {2, 3, 5}};
  for_each_run(rows, rows, {2, 3, 5}, rows, [&](int64_t x, int64_t y, int64_t n) {
    runs.push_back({x, y, n});
  });
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0][2], 30);
}

TEST(Tiling, OverlapsAndGapsAreErrors) {
  StoredTensor t{"w", FileDType::kF32, {4, 2}, {}};
  t.slices = {{"f0", Box{{0, 0}, {2, 2}}, 0, 16}, {"f1", Box{{2, 0}, {2, 2}}, 0, 16}};
  check_tiling(t, "ix");
  t.slices[1].box = Box{{1, 0}, {2, 2}};
  EXPECT_CONTAINS(error_message<IoError>([&] { check_tiling(t, "ix"); }),
                  "ix: tensor w has overlapping slices [0:2, 0:2] (f0) and [1:3, 0:2] (f1)");
  t.slices.pop_back();
  EXPECT_CONTAINS(error_message<IoError>([&] { check_tiling(t, "ix"); }),
                  "ix: the slices of tensor w hold 4 of its 8 elements");
}

}  // namespace
}  // namespace meshtrain
