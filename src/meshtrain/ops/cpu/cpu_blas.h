// The CPU kernels' one GEMM: row-major OpenBLAS (cblas_sgemm / cblas_dgemm) with explicit leading
// dimensions, for float and double, used by matmul, attention and the grouped GEMMs.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace meshtrain::cpu {

// C = alpha op(A) op(B) + beta C; op transposes where ta / tb.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  const auto TA = ta ? CblasTrans : CblasNoTrans;
  const auto TB = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb),
                beta, c, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, TA, TB, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb),
                beta, c, int(ldc));
}

// C = op(A) op(B).
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T* c, int64_t ldc) {
  gemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, T(0), c, ldc);
}

}  // namespace meshtrain::cpu
