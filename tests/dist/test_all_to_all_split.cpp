// all_to_all_v with uneven, zero and skewed row counts in capacity-bounded buffers (every dtype;
// unused capacity stays untouched), the count cross-check, and split ordering and nesting.
#include <gtest/gtest.h>

#include <algorithm>

#include "dist_util.h"
#include "meshtrain/core/check.h"

using namespace meshtrain;
using dist::get_elem;
using dist::nranks;
using dist::rank;
using dist::stream;
using dist::world;

namespace {

constexpr int64_t kCols = 3;
constexpr double kPoison = -77;

// Value of row j, column k of the block that rank src sends to rank dst.
double a2a_val(int src, int dst, int64_t j, int64_t k) {
  return double(((src * 5 + dst * 3 + j * 2 + k) % 29) - 14);
}

// Sends send(src, dst) rows from every rank to every rank and checks what arrives.
void run_all_to_all(DType dt, const std::function<int64_t(int, int)>& send, const char* what) {
  const int n = nranks(), me = rank();
  std::vector<int64_t> send_rows(static_cast<size_t>(n)), recv_rows(static_cast<size_t>(n));
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < n; ++p) {
    send_rows[size_t(p)] = send(me, p);
    recv_rows[size_t(p)] = send(p, me);
    send_total += send_rows[size_t(p)];
    recv_total += recv_rows[size_t(p)];
  }
  // Capacity-bounded: both buffers are larger than the rows in use.
  Tensor in = dist::filled(Shape{send_total + 2, kCols}, dt, [](int64_t) { return 55; });
  int64_t row = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < send_rows[size_t(p)]; ++j, ++row)
      for (int64_t k = 0; k < kCols; ++k) dist::set_elem(in, row * kCols + k, a2a_val(me, p, j, k));
  Tensor out = dist::filled(Shape{recv_total + 3, kCols}, dt, [](int64_t) { return kPoison; });
  world().all_to_all_v(in, send_rows, out, recv_rows, stream());

  std::vector<double> want(size_t((recv_total + 3) * kCols), kPoison);
  row = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < recv_rows[size_t(p)]; ++j, ++row)
      for (int64_t k = 0; k < kCols; ++k) want[size_t(row * kCols + k)] = a2a_val(p, me, j, k);
  dist::expect_elems(
      out.numel(), [&](int64_t i) { return get_elem(out, i); },
      [&](int64_t i) { return want[size_t(i)]; }, fmt::format("{} {}", what, dtype_name(dt)));
}

}  // namespace

TEST(DistAllToAllV, UnevenCountsWithZeroRows) {
  // Includes zero rows to some peers (and to self) for every world size >= 2.
  auto counts = [](int src, int dst) { return int64_t((src + 2 * dst) % 3); };
  int zeros = 0;
  for (int p = 0; p < nranks(); ++p)
    for (int q = 0; q < nranks(); ++q) zeros += counts(p, q) == 0;
  EXPECT_GT(zeros, 0);
  for (DType dt : dist::all_dtypes()) run_all_to_all(dt, counts, "uneven");
}

TEST(DistAllToAllV, SkewedAllRowsToOnePeer) {
  auto counts = [](int src, int dst) { return dst == (src + 1) % nranks() ? int64_t(4) : 0; };
  for (DType dt : dist::all_dtypes()) run_all_to_all(dt, counts, "skewed");
}

TEST(DistAllToAllV, EqualSplitsAndNothingAtAll) {
  run_all_to_all(
      DType::kF32, [](int, int) { return int64_t(2); }, "equal");
  run_all_to_all(
      DType::kBF16, [](int, int) { return int64_t(0); }, "empty");
}

TEST(DistAllToAllV, MismatchedCountsThrowOnEveryRank) {
  if (nranks() < 2) GTEST_SKIP() << "needs a peer to disagree with";
  std::vector<int64_t> send_rows(size_t(nranks()), 1), recv_rows(size_t(nranks()), 1);
  if (rank() == 0) recv_rows[1] = 2;  // rank 1 sends rank 0 one row, not two
  Tensor in = Tensor::empty(Shape{nranks(), kCols}, DType::kF32);
  Tensor out = Tensor::empty(Shape{nranks() + 1, kCols}, DType::kF32);
  try {
    world().all_to_all_v(in, send_rows, out, recv_rows, stream());
    ADD_FAILURE() << "expected CommError";
  } catch (const CommError& e) {
    std::string want = rank() == 0
                           ? "all_to_all_v on rank 0 expects recv_rows[1] = 2 rows from peer 1, "
                             "but that peer sends 1"
                           : "all_to_all_v row counts disagree on rank 0";
    EXPECT_NE(e.message().find(want), std::string::npos) << e.message();
  }
  // The communicator is still usable afterwards.
  Tensor one = Tensor::from_vector<int32_t>({1}, Shape{1});
  world().all_reduce(one, ReduceOp::kSum, stream());
  EXPECT_EQ(one.data<int32_t>()[0], nranks());
}

TEST(DistAllToAllV, ArgumentErrorsAreClear) {
  Tensor in = Tensor::empty(Shape{4, kCols}, DType::kF32);
  Tensor out = Tensor::empty(Shape{4, kCols}, DType::kF32);
  std::vector<int64_t> ok(size_t(nranks()), 0);
  std::vector<int64_t> short_counts(size_t(nranks()) + 1, 0);
  try {
    world().all_to_all_v(in, short_counts, out, ok, stream());
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(e.message().find(fmt::format("expects {} send and recv counts, found {} and {}",
                                           nranks(), nranks() + 1, nranks())),
              std::string::npos)
        << e.message();
  }
  std::vector<int64_t> too_many(size_t(nranks()), 0);
  too_many[0] = 5;  // capacity is 4 rows
  try {
    world().all_to_all_v(in, too_many, out, ok, stream());
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(e.message().find("sends 5 rows from input capacity 4"), std::string::npos)
        << e.message();
  }
  std::vector<int64_t> negative(size_t(nranks()), 0);
  negative[0] = -1;
  EXPECT_THROW(world().all_to_all_v(in, negative, out, ok, stream()), ValueError);
  Tensor wide = Tensor::empty(Shape{4, kCols + 1}, DType::kF32);
  EXPECT_THROW(world().all_to_all_v(in, ok, wide, ok, stream()), ShapeError);
}

TEST(DistSplit, OrdersByKeyThenRankAndNests) {
  const int me = rank(), n = nranks();
  // Reverse order within each parity class.
  auto sub = world().split(me % 2, -me, "parity");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->name(), "parity");
  std::vector<int> want;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == me % 2) want.push_back(q);
  EXPECT_EQ(sub->size(), int(want.size()));
  EXPECT_EQ(dist::members(*sub), want);
  EXPECT_EQ(sub->rank(), int(std::find(want.begin(), want.end(), me) - want.begin()));

  // Equal keys fall back to rank order; a nested split of the split works.
  auto same = world().split(0, 0, "same_key");
  std::vector<int> all(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) all[size_t(q)] = q;
  EXPECT_EQ(dist::members(*same), all);
  auto nested = sub->split(sub->rank() / 2, sub->rank(), "nested");
  ASSERT_NE(nested, nullptr);
  std::vector<int> nested_want;
  for (size_t i = 0; i < want.size(); ++i)
    if (int(i) / 2 == sub->rank() / 2) nested_want.push_back(want[i]);
  EXPECT_EQ(dist::members(*nested), nested_want);

  // A sub-communicator's collectives see only its members.
  Tensor t = Tensor::from_vector<int64_t>({int64_t(me)}, Shape{1});
  sub->all_reduce(t, ReduceOp::kSum, stream());
  int64_t sum = 0;
  for (int q : want) sum += q;
  EXPECT_EQ(t.data<int64_t>()[0], sum);
}

TEST(DistSplit, NegativeColorLeavesRankOut) {
  auto sub = world().split(rank() == 0 ? -1 : 7, rank(), "without_rank0");
  if (rank() == 0) {
    EXPECT_EQ(sub, nullptr);
  } else {
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), nranks() - 1);
    EXPECT_EQ(sub->rank(), rank() - 1);
  }
}
