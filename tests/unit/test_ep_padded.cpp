// The padded expert exchange's index maps (moe/padded_exchange.h) on the CPU kernels, over EP ranks
// simulated in one process (the all_to_all is a block transpose here): rows reach the slot of
// their expert in peer order, come back to the row they left, and rows that do not fit are
// counted, never read or written out of bounds. The sizes the builder plans are checked too.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/runtime/backend.h"
#include "test_support.h"

namespace meshtrain::ops {
namespace {

// One simulated rank: compact groups over E = ep·el experts and its rows (row value = a unique
// id, one float per row), plus what the count exchange would give it.
struct SimRank {
  std::vector<int32_t> groups;  // [2, E]
  std::vector<float> compact;   // [R]
  std::vector<int32_t> recv;    // [ep, el]
};

// counts[r][e]: rows rank r routes to global expert e.
std::vector<SimRank> make_ranks(const std::vector<std::vector<int32_t>>& counts, int64_t el,
                                int64_t rows) {
  const auto ep = int64_t(counts.size()), E = ep * el;
  std::vector<SimRank> ranks(static_cast<size_t>(ep));
  for (int64_t r = 0; r < ep; ++r) {
    SimRank& k = ranks[size_t(r)];
    k.groups.assign(size_t(2 * E), 0);
    int32_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      k.groups[size_t(e)] = at;
      k.groups[size_t(E + e)] = counts[size_t(r)][size_t(e)];
      at += counts[size_t(r)][size_t(e)];
    }
    k.compact.assign(size_t(rows), 0.f);
    for (int32_t i = 0; i < at; ++i) k.compact[size_t(i)] = float(1000 * (r + 1) + i);
    k.recv.assign(size_t(ep * el), 0);
    for (int64_t q = 0; q < ep; ++q)
      for (int64_t e = 0; e < el; ++e)
        k.recv[size_t(q * el + e)] = counts[size_t(q)][size_t(r * el + e)];
  }
  return ranks;
}

Stream& cpu_stream() {
  static std::unique_ptr<Backend> be = create_backend("cpu", 0);
  return be->stream(0);
}

// Applies `map` on rank k: dst = gather(src) through the CPU kernels.
std::vector<float> apply(EpRowMap map, const EpPaddedShape& s, const SimRank& k,
                         const std::vector<float>& src) {
  const EpPaddedKernels& kern = ep_padded_kernels(DeviceType::kCPU);
  const int64_t rows = ep_padded_rows(map, s);
  std::vector<int32_t> idx(static_cast<size_t>(rows));
  Stream& st = cpu_stream();
  kern.index(map, s, k.groups.data(), k.recv.data(), idx.data(), st);
  for (int32_t i : idx) EXPECT_LT(i, int64_t(src.size())) << "a map reads past its source";
  std::vector<float> dst(static_cast<size_t>(rows), -1.f);
  kern.gather(dst.data(), src.data(), idx.data(), rows, sizeof(float), st);
  return dst;
}

// The all_to_all of fixed blocks: rank r's block q goes to rank q's block r.
std::vector<std::vector<float>> transpose_blocks(const std::vector<std::vector<float>>& sent,
                                                 int64_t S) {
  const size_t ep = sent.size();
  std::vector<std::vector<float>> got(ep, std::vector<float>(ep * size_t(S)));
  for (size_t r = 0; r < ep; ++r)
    for (size_t q = 0; q < ep; ++q)
      std::copy_n(sent[r].begin() + long(q * size_t(S)), S, got[q].begin() + long(r * size_t(S)));
  return got;
}

TEST(EpPadded, RowsReachTheirExpertsSlotInPeerOrderAndComeBack) {
  const int64_t el = 2, R = 12;
  // 3 ranks, 6 experts; zero counts included.
  const std::vector<std::vector<int32_t>> counts = {
      {2, 0, 3, 1, 0, 4}, {1, 1, 0, 0, 5, 2}, {0, 3, 2, 2, 1, 1}};
  const EpPaddedShape s{.ep = 3, .el = el, .block_rows = 8, .slot_rows = 8, .compact_rows = R};
  std::vector<SimRank> ranks = make_ranks(counts, el, R);
  std::vector<std::vector<float>> sent;
  for (const SimRank& k : ranks) {
    EXPECT_EQ(ep_padded_overflows(s, k.groups.data(), k.recv.data()), 0);
    sent.push_back(apply(EpRowMap::kCompactToBlocks, s, k, k.compact));
  }
  const auto got = transpose_blocks(sent, s.block_rows);
  std::vector<std::vector<float>> back_sent;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<float> slots = apply(EpRowMap::kBlocksToSlots, s, ranks[r], got[r]);
    // Slot e holds the rows of global expert r·el + e from peer 0, then 1, then 2, then zeros.
    for (int64_t e = 0; e < el; ++e) {
      std::vector<float> want;
      for (size_t q = 0; q < ranks.size(); ++q) {
        const SimRank& from = ranks[q];
        const int64_t g = int64_t(r) * el + e;
        for (int32_t i = 0; i < from.groups[size_t(3 * el + g)]; ++i)
          want.push_back(from.compact[size_t(from.groups[size_t(g)] + i)]);
      }
      want.resize(size_t(s.slot_rows), 0.f);
      EXPECT_EQ(std::vector<float>(slots.begin() + e * s.slot_rows,
                                   slots.begin() + (e + 1) * s.slot_rows),
                want)
          << "rank " << r << " slot " << e;
    }
    back_sent.push_back(apply(EpRowMap::kSlotsToBlocks, s, ranks[r], slots));
  }
  const auto back = transpose_blocks(back_sent, s.block_rows);
  for (size_t r = 0; r < ranks.size(); ++r)
    EXPECT_EQ(apply(EpRowMap::kBlocksToCompact, s, ranks[r], back[r]), ranks[r].compact)
        << "rank " << r;
}

TEST(EpPadded, RowsThatDoNotFitAreCountedAndNeverReadOutOfBounds) {
  const int64_t el = 2, R = 16;
  // Rank 0 sends 9 rows to rank 1 (block 4); rank 1's expert 2 receives 9 + 2 rows (slot 4).
  const std::vector<std::vector<int32_t>> counts = {{1, 0, 9, 0}, {1, 1, 2, 0}};
  const EpPaddedShape s{.ep = 2, .el = el, .block_rows = 4, .slot_rows = 4, .compact_rows = R};
  std::vector<SimRank> ranks = make_ranks(counts, el, R);
  EXPECT_EQ(ep_padded_overflows(s, ranks[0].groups.data(), ranks[0].recv.data()), 1);  // sent
  // Received: the block from rank 0 (9 > 4) and expert 2's slot (11 > 4).
  EXPECT_EQ(ep_padded_overflows(s, ranks[1].groups.data(), ranks[1].recv.data()), 2);
  std::vector<std::vector<float>> sent;
  for (const SimRank& k : ranks) sent.push_back(apply(EpRowMap::kCompactToBlocks, s, k, k.compact));
  const auto got = transpose_blocks(sent, s.block_rows);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<float> slots = apply(EpRowMap::kBlocksToSlots, s, ranks[r], got[r]);
    apply(EpRowMap::kSlotsToBlocks, s, ranks[r], slots);
    apply(EpRowMap::kBlocksToCompact, s, ranks[r], got[r]);
  }
}

TEST(EpPadded, BuilderPlansBlocksAndSlotsFromTheCapacityFactor) {
  // 256 routed rows per rank, EP 4, 2 local experts, alignment 8, factor 1.5: a block holds
  // 1.5 × 64 = 96 rows, a slot 1.5 × 128 = 192 rows.
  EpPaddedShape s = ep_padded_shape(4, 256, 2, 8, 1.5);
  EXPECT_EQ(s.block_rows, 96);
  EXPECT_EQ(s.slot_rows, 192);
  EXPECT_EQ(s.compact_rows, 256);
  // Factor 8: a block never holds more than all 256 rows, a slot never more than all blocks.
  s = ep_padded_shape(4, 256, 2, 8, 8.0);
  EXPECT_EQ(s.block_rows, 256);
  EXPECT_EQ(s.slot_rows, 1024);
  // Slots padded to the alignment: 1.25 × 100 / 3 = 41.7 -> 42 -> 48.
  EXPECT_EQ(ep_padded_shape(2, 100, 3, 8, 1.25).slot_rows, 48);
  EXPECT_EQ(testing::error_message<ConfigError>([] { ep_padded_shape(2, 100, 3, 8, 0.0); }),
            "[parallelism] expert_capacity_factor must be > 0, found 0");
}

}  // namespace
}  // namespace meshtrain::ops
