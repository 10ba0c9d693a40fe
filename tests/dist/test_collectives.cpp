// all_gather, reduce_scatter, all_reduce and broadcast over MPI for every dtype, against values
// computed locally; bf16 accumulation in float32; determinism and cross-rank agreement on
// random data; float sums in rank order at any buffer length, and in ring order on request;
// staging-buffer reuse; argument errors; MPI_CHECK.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>

#include "dist_util.h"
#include "meshtrain/comm/mpi/mpi_check.h"
#include "meshtrain/comm/mpi/mpi_communicator.h"
#include "meshtrain/core/check.h"

using namespace meshtrain;
using dist::get_elem;
using dist::nranks;
using dist::rank;
using dist::stream;
using dist::world;

namespace {

// Small integers: every sum over <= 8 ranks is exact in every dtype, bfloat16 included.
double val(int r, int64_t i) { return double(((r * 31 + i * 7) % 33) - 16); }

double reduce_ref(ReduceOp op, const std::function<double(int)>& x) {
  double acc = x(0);
  for (int p = 1; p < nranks(); ++p) {
    double v = x(p);
    acc = op == ReduceOp::kSum   ? acc + v
          : op == ReduceOp::kMax ? std::max(acc, v)
                                 : std::min(acc, v);
  }
  return acc;
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
constexpr int64_t kSizes[] = {0, 1, 7, 300};

std::vector<float> random_floats(uint64_t seed, int r, int64_t n) {
  std::mt19937_64 g(seed * 1000003u + uint64_t(r));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(g);
  return v;
}

}  // namespace

TEST(DistCollectives, ReduceOpNames) {
  EXPECT_STREQ(reduce_op_name(ReduceOp::kSum), "sum");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMax), "max");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMin), "min");
}

TEST(DistCollectives, AllGatherEveryDtype) {
  for (DType dt : dist::all_dtypes())
    for (int64_t n : kSizes) {
      Tensor in = dist::filled(Shape{n}, dt, [](int64_t i) { return val(rank(), i); });
      Tensor out = dist::filled(Shape{nranks() * n}, dt, [](int64_t) { return -99; });
      world().all_gather(in, out, stream());
      dist::expect_elems(
          nranks() * n, [&](int64_t k) { return get_elem(out, k); },
          [&](int64_t k) { return val(int(k / n), k % n); },
          fmt::format("all_gather {} n={}", dtype_name(dt), n));
    }
  // Multi-dimensional blocks concatenate along dim 0.
  Tensor in = dist::filled(Shape{3, 5}, DType::kF32, [](int64_t i) { return val(rank(), i); });
  Tensor out = Tensor::empty(Shape{3 * nranks(), 5}, DType::kF32);
  world().all_gather(in, out, stream());
  dist::expect_elems(
      15 * nranks(), [&](int64_t k) { return get_elem(out, k); },
      [&](int64_t k) { return val(int(k / 15), k % 15); }, "all_gather 2-d");
}

TEST(DistCollectives, AllGatherInPlace) {
  const int64_t n = 9;
  Tensor out = dist::filled(Shape{nranks() * n}, DType::kBF16, [](int64_t) { return -99; });
  Tensor mine = out.slice_rows(rank() * n, (rank() + 1) * n);
  for (int64_t i = 0; i < n; ++i) dist::set_elem(mine, i, val(rank(), i));
  world().all_gather(mine, out, stream());
  dist::expect_elems(
      nranks() * n, [&](int64_t k) { return get_elem(out, k); },
      [&](int64_t k) { return val(int(k / n), k % n); }, "in-place all_gather");
}

TEST(DistCollectives, ReduceScatterEveryDtypeAndOp) {
  for (DType dt : dist::all_dtypes())
    for (ReduceOp op : kOps)
      for (int64_t m : kSizes) {
        Tensor in = dist::filled(Shape{nranks() * m}, dt, [](int64_t i) { return val(rank(), i); });
        Tensor out = dist::filled(Shape{m}, dt, [](int64_t) { return -99; });
        world().reduce_scatter(in, out, op, stream());
        dist::expect_elems(
            m, [&](int64_t j) { return get_elem(out, j); },
            [&](int64_t j) {
              return reduce_ref(op, [&](int p) { return val(p, rank() * m + j); });
            },
            fmt::format("reduce_scatter {} {} m={}", dtype_name(dt), reduce_op_name(op), m));
      }
}

TEST(DistCollectives, AllReduceEveryDtypeAndOp) {
  for (DType dt : dist::all_dtypes())
    for (ReduceOp op : kOps)
      for (int64_t n : kSizes) {
        Tensor buf = dist::filled(Shape{n}, dt, [](int64_t i) { return val(rank(), i); });
        world().all_reduce(buf, op, stream());
        dist::expect_elems(
            n, [&](int64_t i) { return get_elem(buf, i); },
            [&](int64_t i) { return reduce_ref(op, [&](int p) { return val(p, i); }); },
            fmt::format("all_reduce {} {} n={}", dtype_name(dt), reduce_op_name(op), n));
      }
}

TEST(DistCollectives, Int64BeyondDoublePrecision) {
  // 2^58 + small: exact only if no step goes through double or float.
  const int64_t base = int64_t(1) << 58;
  const int64_t n = 5;
  std::vector<int64_t> mine(n);
  for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = base + rank() * 3 + i;
  for (ReduceOp op : kOps) {
    Tensor buf = Tensor::from_vector<int64_t>(mine, Shape{n});
    world().all_reduce(buf, op, stream());
    for (int64_t i = 0; i < n; ++i) {
      int64_t want = op == ReduceOp::kSum ? 0 : op == ReduceOp::kMax ? INT64_MIN : INT64_MAX;
      for (int p = 0; p < nranks(); ++p) {
        int64_t v = base + p * 3 + i;
        want = op == ReduceOp::kSum   ? want + v
               : op == ReduceOp::kMax ? std::max(want, v)
                                      : std::min(want, v);
      }
      EXPECT_EQ(buf.data<int64_t>()[i], want) << reduce_op_name(op);
    }
  }
}

// One rank holds `big`, the others big * 2^-8 (exactly half a bf16 ulp of big). Summed in bf16
// pairwise, in rank order, every step is a tie that rounds back to big; summed in float32 and
// rounded once, (n-1) half-ulps survive. For n == 2 both give the same (one rounding either way).
TEST(DistCollectives, Bf16SumAccumulatesInFloat32) {
  const int n = nranks();
  const int64_t m = 4;
  const int64_t total = int64_t(n) * m;
  auto x = [&](int p, int64_t i) {
    float big = std::ldexp(1.f, int(i % 3));
    return p == int(i % n) ? big : big * (1.f / 256.f);
  };
  auto f32_then_round = [&](int64_t i) {
    float s = 0;
    for (int p = 0; p < n; ++p) s += x(p, i);  // exact: few bits, far from float32's limit
    return float(BFloat16(s));
  };
  auto pairwise_bf16 = [&](int64_t i) {
    float acc = float(BFloat16(x(0, i)));
    for (int p = 1; p < n; ++p) acc = float(BFloat16(acc + x(p, i)));
    return acc;
  };
  int differing = 0;
  for (int64_t i = 0; i < total; ++i) differing += f32_then_round(i) != pairwise_bf16(i);
  if (n >= 3) {
    EXPECT_GT(differing, 0) << "the case must separate the two roundings";
  }

  Tensor buf = dist::filled(Shape{total}, DType::kBF16, [&](int64_t i) { return x(rank(), i); });
  Tensor rs_in = dist::filled(Shape{total}, DType::kBF16, [&](int64_t i) { return x(rank(), i); });
  Tensor rs_out = Tensor::empty(Shape{m}, DType::kBF16);
  world().all_reduce(buf, ReduceOp::kSum, stream());
  world().reduce_scatter(rs_in, rs_out, ReduceOp::kSum, stream());
  dist::expect_elems(
      total, [&](int64_t i) { return get_elem(buf, i); },
      [&](int64_t i) { return f32_then_round(i); }, "bf16 all_reduce");
  dist::expect_elems(
      m, [&](int64_t j) { return get_elem(rs_out, j); },
      [&](int64_t j) { return f32_then_round(rank() * m + j); }, "bf16 reduce_scatter");
}

// Random data: close to a float64 reference, bitwise equal when repeated, equal on every rank.
TEST(DistCollectives, FloatReductionsAreDeterministic) {
  const uint64_t seed = dist::shared_fresh_seed();
  for (int64_t n : {int64_t(1000), int64_t(1) << 16}) {
    auto mine = random_floats(seed, rank(), n);
    for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
      auto make = [&] {
        return dist::filled(Shape{n}, dt, [&](int64_t i) { return mine[size_t(i)]; });
      };
      Tensor a = make(), b = make();
      world().all_reduce(a, ReduceOp::kSum, stream());
      world().all_reduce(b, ReduceOp::kSum, stream());
      EXPECT_EQ(dist::bytes_of(a), dist::bytes_of(b)) << dtype_name(dt) << " n=" << n;
      EXPECT_TRUE(dist::same_bytes_on_all_ranks(world(), a)) << dtype_name(dt) << " n=" << n;
      // Inputs were rounded to dt, so compare against the sum of the rounded inputs.
      std::vector<double> ref_dt(size_t(n), 0.0);
      for (int p = 0; p < nranks(); ++p) {
        auto v = random_floats(seed, p, n);
        Tensor t = dist::filled(Shape{n}, dt, [&](int64_t i) { return v[size_t(i)]; });
        for (int64_t i = 0; i < n; ++i) ref_dt[size_t(i)] += get_elem(t, i);
      }
      // |sum| <= nranks: float32 partial sums err by ~nranks ulps; bf16 adds one rounding of
      // the float32 sum: half a bf16 ulp, at most |x| * 2^-8.
      double tol = dt == DType::kF64 ? 1e-13 * nranks() : 1e-6 * nranks();
      double rel = dt == DType::kBF16 ? 1.0 / 256 : 0.0;
      for (int64_t i = 0; i < n; ++i) {
        double got = get_elem(a, i), want = ref_dt[size_t(i)];
        if (std::abs(got - want) > tol + rel * std::abs(want)) {
          ADD_FAILURE() << dtype_name(dt) << " n=" << n << " element " << i << ": " << got
                        << " vs reference " << want;
          break;
        }
      }

      Tensor rin = dist::filled(Shape{n}, dt, [&](int64_t i) { return mine[size_t(i)]; });
      if (n % nranks() != 0) continue;
      Tensor r1 = Tensor::empty(Shape{n / nranks()}, dt),
             r2 = Tensor::empty(Shape{n / nranks()}, dt);
      world().reduce_scatter(rin, r1, ReduceOp::kSum, stream());
      world().reduce_scatter(rin, r2, ReduceOp::kSum, stream());
      EXPECT_EQ(dist::bytes_of(r1), dist::bytes_of(r2)) << dtype_name(dt);
      const int64_t m = n / nranks();
      dist::expect_elems(
          m, [&](int64_t j) { return get_elem(r1, j); },
          [&](int64_t j) { return ref_dt[size_t(rank() * m + j)]; },
          fmt::format("reduce_scatter {} n={}", dtype_name(dt), n),
          dt == DType::kBF16 ? nranks() / 256.0 : 1e-5);
    }
  }
}

// Float sums go element by element in rank order: the result is the explicit left-to-right sum
// over ranks, bit for bit, and a slice all-reduced alone equals the same elements all-reduced
// inside a longer buffer (what makes a bucketed gradient all-reduce equal the per-tensor ones).
TEST(DistCollectives, FloatSumsAreInRankOrderWhateverTheBufferLength) {
  const uint64_t seed = dist::shared_fresh_seed();
  const int64_t n = 1001, off = 3, len = 17;
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
    std::vector<Tensor> inputs;  // every rank's input, rounded to dt
    for (int p = 0; p < nranks(); ++p) {
      auto v = random_floats(seed, p, n);
      inputs.push_back(dist::filled(Shape{n}, dt, [&](int64_t i) { return v[size_t(i)]; }));
    }
    Tensor whole =
        dist::filled(Shape{n}, dt, [&](int64_t i) { return get_elem(inputs[size_t(rank())], i); });
    Tensor part = dist::filled(
        Shape{len}, dt, [&](int64_t i) { return get_elem(inputs[size_t(rank())], off + i); });
    world().all_reduce(whole, ReduceOp::kSum, stream());
    world().all_reduce(part, ReduceOp::kSum, stream());
    for (int64_t i = 0; i < len; ++i)
      ASSERT_EQ(get_elem(part, i), get_elem(whole, off + i))
          << dtype_name(dt) << ": element " << off + i << " alone and inside " << n;
    if (dt == DType::kBF16) continue;  // bf16: a float32 sum rounded once (tested above)
    for (int64_t i = 0; i < n; ++i) {
      double acc = get_elem(inputs[0], i);
      if (dt == DType::kF32) {
        float f = float(acc);
        for (int p = 1; p < nranks(); ++p) f += float(get_elem(inputs[size_t(p)], i));
        acc = f;
      } else {
        for (int p = 1; p < nranks(); ++p) acc += get_elem(inputs[size_t(p)], i);
      }
      ASSERT_EQ(get_elem(whole, i), acc) << dtype_name(dt) << " element " << i;
    }
  }
}

// MESHTRAIN_MPI_SUM_ORDER=ring (read when a communicator is made): rank r's block of a
// reduce-scatter, and block b of an all-reduce, sum from rank r + 1 (b + 1) on, wrapping around,
// as NCCL's ring does; any other value than rank or ring is refused by name.
TEST(DistCollectives, RingSumOrderStartsAfterTheBlockOwner) {
  const uint64_t seed = dist::shared_fresh_seed();
  const int W = nranks();
  ::setenv(kMpiSumOrderVar, "ring", 1);
  std::unique_ptr<Communicator> ring = world().split(0, rank(), "ring_sums");
  ::unsetenv(kMpiSumOrderVar);
  const int64_t m = 5, n = m * W;
  std::vector<std::vector<float>> x;
  for (int p = 0; p < W; ++p) x.push_back(random_floats(seed, p, n));
  auto ring_sum = [&](int block, int64_t i) {
    float acc = x[size_t((block + 1) % W)][size_t(i)];
    for (int k = 1; k < W; ++k) acc += x[size_t((block + 1 + k) % W)][size_t(i)];
    return double(acc);
  };
  Tensor in =
      dist::filled(Shape{n}, DType::kF32, [&](int64_t i) { return x[size_t(rank())][size_t(i)]; });
  Tensor out = Tensor::empty(Shape{m}, DType::kF32);
  ring->reduce_scatter(in, out, ReduceOp::kSum, stream());
  dist::expect_elems(
      m, [&](int64_t i) { return get_elem(out, i); },
      [&](int64_t i) { return ring_sum(rank(), rank() * m + i); }, "ring reduce_scatter");
  ring->all_reduce(in, ReduceOp::kSum, stream());
  dist::expect_elems(
      n, [&](int64_t i) { return get_elem(in, i); },
      [&](int64_t i) { return ring_sum(int(i / m), i); }, "ring all_reduce");
  ::setenv(kMpiSumOrderVar, "tree", 1);
  try {
    world().split(0, rank(), "bad_order");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("MESHTRAIN_MPI_SUM_ORDER=tree is not a sum order: expected rank "
                               "(the default) or ring"),
              std::string::npos)
        << e.message();
  }
  ::unsetenv(kMpiSumOrderVar);
}

TEST(DistCollectives, BroadcastEveryDtypeFromEveryRoot) {
  for (DType dt : dist::all_dtypes())
    for (int root = 0; root < nranks(); ++root) {
      Tensor buf = dist::filled(Shape{2, 11}, dt,
                                [&](int64_t i) { return rank() == root ? val(root, i) : -99; });
      world().broadcast(buf, root, stream());
      dist::expect_elems(
          22, [&](int64_t i) { return get_elem(buf, i); }, [&](int64_t i) { return val(root, i); },
          fmt::format("broadcast {} root {}", dtype_name(dt), root));
    }
}

TEST(DistCollectives, Bf16StagingIsAllocatedOnceAndReused) {
  auto sub = world().split(0, rank(), "staging");
  auto* mpi = dynamic_cast<MpiCommunicator*>(sub.get());
  ASSERT_NE(mpi, nullptr);
  EXPECT_EQ(mpi->staging_bytes(), 0u);
  const int64_t n = 64 * nranks();
  Tensor a = dist::filled(Shape{n}, DType::kBF16, [](int64_t i) { return val(rank(), i); });
  Tensor o = Tensor::empty(Shape{n / nranks()}, DType::kBF16);
  sub->all_reduce(a, ReduceOp::kSum, stream());  // first use grows the staging buffers
  sub->reduce_scatter(a, o, ReduceOp::kSum, stream());
  const size_t staged = mpi->staging_bytes();
  EXPECT_GE(staged, size_t(n) * 4);
  const int64_t before = allocation_count();
  for (int it = 0; it < 3; ++it) {
    sub->all_reduce(a, ReduceOp::kMax, stream());
    sub->reduce_scatter(a, o, ReduceOp::kSum, stream());
    sub->all_reduce(a.slice_rows(0, n / 2), ReduceOp::kSum, stream());  // smaller: reuses
  }
  EXPECT_EQ(allocation_count(), before);
  EXPECT_EQ(mpi->staging_bytes(), staged);
}

TEST(DistCollectives, ArgumentErrorsAreClear) {
  Tensor in = Tensor::empty(Shape{4}, DType::kF32);
  Tensor bad = Tensor::empty(Shape{4 * nranks() + 1}, DType::kF32);
  try {
    world().all_gather(in, bad, stream());
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(e.message().find("all_gather expects output of"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("'world'"), std::string::npos) << e.message();
  }
  Tensor other = Tensor::empty(Shape{4 * nranks()}, DType::kF64);
  EXPECT_THROW(world().all_gather(in, other, stream()), ValueError);
  EXPECT_THROW(world().reduce_scatter(other, in, ReduceOp::kSum, stream()), ValueError);
  Tensor big = Tensor::empty(Shape{4 * nranks()}, DType::kF32);
  EXPECT_THROW(world().reduce_scatter(big, big.slice_rows(0, 4), ReduceOp::kSum, stream()),
               ValueError);
  try {
    world().broadcast(in, nranks(), stream());
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find(
                  fmt::format("broadcast root must be in [0, {}), found {}", nranks(), nranks())),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(world().all_reduce(Tensor(), ReduceOp::kSum, stream()), ValueError);
}

TEST(DistCollectives, MpiCheckNamesCallAndRank) {
  auto& mpi = dynamic_cast<MpiCommunicator&>(world());
  int x = 0;
  try {
    MPI_CHECK(MPI_Bcast(&x, 1, MPI_INT, nranks() + 3, mpi.native()));
    ADD_FAILURE() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(e.message().find(
                  "MPI_Bcast(&x, 1, MPI_INT, nranks() + 3, mpi.native()) failed on world rank " +
                  std::to_string(rank())),
              std::string::npos)
        << e.message();
    EXPECT_NE(std::string(e.what()).find("[rank " + std::to_string(rank()) + "]"),
              std::string::npos);
  }
  world().barrier();
}
