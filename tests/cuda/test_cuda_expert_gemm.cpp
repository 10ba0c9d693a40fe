// ExpertGemm (the per-expert cuBLASLt GEMM with per-bucket algorithms) against a float64 host
// product: for extents at and around the bucket bounds, both varying extents (n: grouped_matmul,
// k: its wgrad) and both transposes, bf16 and float32, from fresh random inputs. The output is
// poisoned with NaN first, so unwritten elements fail; columns past the extent must stay
// poisoned (nothing written out of range). Aligned shapes must run cuBLASLt (see the test).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/moe/cuda/expert_gemm.h"
#include "meshtrain/ops/cuda/cublaslt_matmul.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {
namespace {

using cuda::blas_handle;
using cuda::ExpertGemm;
using cuda::ExpertGemmShape;
using cuda::kGemmWorkspaceBytes;

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DeviceBuffer() { cudaFree(p); }
};

// Column-major [rows, cols] with leading dim ld = rows, values rounded to `dt`.
std::vector<double> random_matrix(int64_t rows, int64_t cols, DType dt, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(size_t(rows * cols));
  for (double& x : v)
    x = dt == DType::kBF16 ? double(float(BFloat16(float(u(rng))))) : double(float(u(rng)));
  return v;
}

std::vector<uint8_t> encode(const std::vector<double>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kBF16) {
      const BFloat16 b(float(v[i]));
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      const float f = float(v[i]);
      std::memcpy(&out[i * 4], &f, 4);
    }
  }
  return out;
}

double decode(const uint8_t* p, DType dt) {
  if (dt == DType::kBF16) {
    BFloat16 b;
    std::memcpy(&b, p, 2);
    return double(float(b));
  }
  float f;
  std::memcpy(&f, p, 4);
  return double(f);
}

// Runs shape `s` (extent of the varying dim at its maximum) for each extent and checks C.
void check_shape(const ExpertGemmShape& s, const std::vector<int64_t>& extents) {
  SCOPED_TRACE(fmt::format("{} m {} n {} k {} ta {} tb {} vary {}", dtype_name(s.dtype), s.m, s.n,
                           s.k, s.ta, s.tb, s.vary_k ? "k" : "n"));
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::mt19937_64 rng(uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  const size_t ws_bytes = kGemmWorkspaceBytes / 4;
  ExpertGemm gemm(device, s, ws_bytes);
  // The fast path must be taken: every bucket in bf16 (what training runs), every bucket from 128
  // rows up in float32 (cuBLASLt may have no fp32 algorithm that spans 1..16 rows).
  for (int i = 0; i < int(gemm.bounds().size()); ++i) {
    if (s.dtype == DType::kBF16 || gemm.bounds()[size_t(i)] > 128) {
      EXPECT_TRUE(gemm.bucket_uses_lt(i))
          << "bucket up to " << gemm.bounds()[size_t(i)] << " rows runs classic cuBLAS";
    }
  }
  const size_t elem = dtype_size(s.dtype);
  // Stored extents (column-major, ld = rows) at the maximum.
  const int64_t a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
  const int64_t b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
  const std::vector<double> a = random_matrix(a_rows, a_cols, s.dtype, rng);
  const std::vector<double> b = random_matrix(b_rows, b_cols, s.dtype, rng);
  DeviceBuffer da(a.size() * elem), db(b.size() * elem), dc(size_t(s.m * s.n) * elem);
  DeviceBuffer dws(ws_bytes);
  CUDA_CHECK(cudaMemcpy(da.p, encode(a, s.dtype).data(), a.size() * elem, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db.p, encode(b, s.dtype).data(), b.size() * elem, cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas = blas_handle(device);
  CUBLAS_CHECK(cublasSetStream(blas, stream));
  CUBLAS_CHECK(cublasSetWorkspace(blas, dws.p, ws_bytes));
  std::vector<uint8_t> got(size_t(s.m * s.n) * elem);
  for (int64_t e : extents) {
    SCOPED_TRACE(fmt::format("extent {}", e));
    const int64_t n = s.vary_k ? s.n : e, k = s.vary_k ? e : s.k;
    CUDA_CHECK(cudaMemsetAsync(dc.p, 0xFF, got.size(), stream));
    gemm.run(e, da.p, db.p, dc.p, dws.p, ws_bytes, stream, blas);
    CUDA_CHECK(cudaMemcpyAsync(got.data(), dc.p, got.size(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // op(A)[i, l] and op(B)[l, j] from the stored column-major matrices (ld = stored rows).
    auto opa = [&](int64_t i, int64_t l) {
      return s.ta ? a[size_t(i * a_rows + l)] : a[size_t(l * a_rows + i)];
    };
    auto opb = [&](int64_t l, int64_t j) {
      return s.tb ? b[size_t(l * b_rows + j)] : b[size_t(j * b_rows + l)];
    };
    double worst = 0, scale = 0;
    int64_t bad = 0;
    for (int64_t j = 0; j < s.n; ++j)
      for (int64_t i = 0; i < s.m; ++i) {
        const double g = decode(&got[size_t(j * s.ldc + i) * elem], s.dtype);
        if (j >= n) {  // past the extent: still the poison
          bad += !std::isnan(g);
          continue;
        }
        double ref = 0;
        for (int64_t l = 0; l < k; ++l) ref += opa(i, l) * opb(l, j);
        scale = std::max(scale, std::abs(ref));
        worst = std::max(worst, std::isnan(g) ? INFINITY : std::abs(g - ref));
      }
    EXPECT_EQ(bad, 0) << "columns past the extent were written";
    // bf16 output: one rounding (2^-8 relative) of values up to `scale`; fp32: accumulation order.
    const double tol = (s.dtype == DType::kBF16 ? 8e-3 : 1e-5) * std::max(scale, 1.0);
    EXPECT_LE(worst, tol) << "max |got - ref| over max |ref| " << scale;
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaExpertGemm, BucketBounds) {
  const std::vector<int64_t> b = ExpertGemm::bucket_bounds(1000);
  ASSERT_GE(b.size(), 5u);
  EXPECT_EQ(b.front(), 16);
  EXPECT_EQ(b.back(), 1000);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  EXPECT_EQ(ExpertGemm::bucket_bounds(10), std::vector<int64_t>{10});
}

TEST(CudaExpertGemm, MatchesHostProductAcrossBuckets) {
  const std::vector<int64_t> extents = {1, 15, 16, 17, 100, 128, 129, 161, 999, 1200};
  for (DType dt : {DType::kBF16, DType::kF32}) {
    // grouped_matmul, weight transposed and not: C[96, count] = op(W)[96, 64] X[64, count].
    check_shape({.dtype = dt,
                 .ta = true,
                 .tb = false,
                 .m = 96,
                 .n = 1200,
                 .k = 64,
                 .lda = 64,
                 .ldb = 64,
                 .ldc = 96,
                 .vary_k = false},
                extents);
    check_shape({.dtype = dt,
                 .ta = false,
                 .tb = false,
                 .m = 96,
                 .n = 1200,
                 .k = 64,
                 .lda = 96,
                 .ldb = 64,
                 .ldc = 96,
                 .vary_k = false},
                extents);
    // wgrad: C[96, 64] = B[96, count] Aᵀ (A stored [64, count]).
    check_shape({.dtype = dt,
                 .ta = false,
                 .tb = true,
                 .m = 96,
                 .n = 64,
                 .k = 1200,
                 .lda = 96,
                 .ldb = 64,
                 .ldc = 96,
                 .vary_k = true},
                extents);
  }
}

}  // namespace
}  // namespace meshtrain::cudatest
