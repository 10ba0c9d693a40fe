// CPU attention kernels: per (batch, q head, block of query rows) a [block, S] score tile lives
// in workspace; products run through OpenBLAS on strided views of [B, S, H, D] (no packing).
// dk/dv accumulate over row blocks and GQA heads in a fixed order (deterministic).
#include "meshtrain/ops/attention.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/ops/cpu/cpu_blas.h"
#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

using ops::AttentionDims;

// Queries are walked in blocks of this many rows; with causal masking each block only multiplies
// against the keys it can see. The workspace holds one [block, S] tile per buffer.
constexpr int64_t kRowBlock = 64;

// Kernels compute in the input dtype (float32 or float64): bytes of one [row block, S] tile.
size_t tile_bytes(const TensorMeta& q) {
  const int64_t s = q.shape[1];
  const size_t elem = dtype_size(q.dtype == DType::kF64 ? DType::kF64 : DType::kF32);
  return size_t(std::min(s, kRowBlock) * s) * elem;
}

// Pointers to the (b, h) slice of each tensor and their row strides.
struct HeadView {
  int64_t q_off, kv_qk_off, kv_v_off, o_off, lse_off;
  int64_t ld_q, ld_k, ld_v, ld_o;
};
HeadView head_view(const AttentionDims& d, int64_t b, int64_t h) {
  const int64_t g = h / (d.heads_q / d.heads_kv);
  return {(b * d.seq * d.heads_q + h) * d.dim_qk,
          (b * d.seq * d.heads_kv + g) * d.dim_qk,
          (b * d.seq * d.heads_kv + g) * d.dim_v,
          (b * d.seq * d.heads_q + h) * d.dim_v,
          (b * d.heads_q + h) * d.seq,
          d.heads_q * d.dim_qk,
          d.heads_kv * d.dim_qk,
          d.heads_kv * d.dim_v,
          d.heads_q * d.dim_v};
}

// Rows [i0, i1) of one (batch, head): with causal masking they see keys [0, i1) only, so every
// product below runs over `keys` columns instead of S. Tiles have row stride S.
struct RowBlock {
  int64_t i0, rows, keys;
};
RowBlock row_block(int64_t i0, int64_t s, bool causal) {
  const int64_t i1 = std::min(s, i0 + kRowBlock);
  return {i0, i1 - i0, causal ? i1 : s};
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, T* p,
                       const AttentionDims& d, double scale, bool causal) {
  const int64_t s = d.seq;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads_q; ++h) {
      const HeadView hv = head_view(d, b, h);
      for (int64_t i0 = 0; i0 < s; i0 += kRowBlock) {
        const RowBlock rb = row_block(i0, s, causal);
        gemm<T>(false, true, rb.rows, rb.keys, d.dim_qk, T(scale), q + hv.q_off + i0 * hv.ld_q,
                hv.ld_q, k + hv.kv_qk_off, hv.ld_k, T(0), p, s);
        for (int64_t r = 0; r < rb.rows; ++r) {
          T* row = p + r * s;
          const int64_t n = causal ? i0 + r + 1 : s;
          T m = row[0];
          for (int64_t j = 1; j < n; ++j) m = std::max(m, row[j]);
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            row[j] = std::exp(row[j] - m);
            sum += double(row[j]);
          }
          const T inv = T(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          for (int64_t j = n; j < rb.keys; ++j) row[j] = T(0);
          lse[hv.lse_off + i0 + r] = T(double(m) + std::log(sum));
        }
        gemm<T>(false, false, rb.rows, d.dim_v, rb.keys, T(1), p, s, v + hv.kv_v_off, hv.ld_v, T(0),
                out + hv.o_off + i0 * hv.ld_o, hv.ld_o);
      }
    }
}

template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* out, const T* lse,
                        const T* dout, T* dq, T* dk, T* dv, T* p, T* dp, const AttentionDims& d,
                        double scale, bool causal) {
  const int64_t s = d.seq;
  std::fill_n(dk, d.batch * s * d.heads_kv * d.dim_qk, T(0));
  std::fill_n(dv, d.batch * s * d.heads_kv * d.dim_v, T(0));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads_q; ++h) {
      const HeadView hv = head_view(d, b, h);
      const T* kh = k + hv.kv_qk_off;
      const T* vh = v + hv.kv_v_off;
      for (int64_t i0 = 0; i0 < s; i0 += kRowBlock) {
        const RowBlock rb = row_block(i0, s, causal);
        const T* qb = q + hv.q_off + i0 * hv.ld_q;
        const T* ob = out + hv.o_off + i0 * hv.ld_o;
        const T* dob = dout + hv.o_off + i0 * hv.ld_o;
        // P = exp(scale q k^T - lse), zero where causal masking hides a key.
        gemm<T>(false, true, rb.rows, rb.keys, d.dim_qk, T(scale), qb, hv.ld_q, kh, hv.ld_k, T(0),
                p, s);
        for (int64_t r = 0; r < rb.rows; ++r) {
          T* row = p + r * s;
          const int64_t n = causal ? i0 + r + 1 : s;
          const T l = lse[hv.lse_off + i0 + r];
          for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - l);
          for (int64_t j = n; j < rb.keys; ++j) row[j] = T(0);
        }
        // dV += P^T dO;  dP = dO V^T.
        gemm<T>(true, false, rb.keys, d.dim_v, rb.rows, T(1), p, s, dob, hv.ld_o, T(1),
                dv + hv.kv_v_off, hv.ld_v);
        gemm<T>(false, true, rb.rows, rb.keys, d.dim_v, T(1), dob, hv.ld_o, vh, hv.ld_v, T(0), dp,
                s);
        // dS = P (dP - D_i) with D_i = rowsum(dO * O), written over dP.
        for (int64_t r = 0; r < rb.rows; ++r) {
          const T* o_row = ob + r * hv.ld_o;
          const T* do_row = dob + r * hv.ld_o;
          double di = 0;
          for (int64_t c = 0; c < d.dim_v; ++c) di += double(do_row[c]) * double(o_row[c]);
          T* dp_row = dp + r * s;
          const T* p_row = p + r * s;
          for (int64_t j = 0; j < rb.keys; ++j) dp_row[j] = p_row[j] * (dp_row[j] - T(di));
        }
        // dQ = scale dS K;  dK += scale dS^T Q.
        gemm<T>(false, false, rb.rows, d.dim_qk, rb.keys, T(scale), dp, s, kh, hv.ld_k, T(0),
                dq + hv.q_off + i0 * hv.ld_q, hv.ld_q);
        gemm<T>(true, false, rb.keys, d.dim_qk, rb.rows, T(scale), dp, s, qb, hv.ld_q, T(1),
                dk + hv.kv_qk_off, hv.ld_k);
      }
    }
}

AttentionDims dims_of(const KernelContext& c) {
  auto meta = [&](int i) { return TensorMeta{c.in[size_t(i)].shape(), c.in[size_t(i)].dtype()}; };
  return ops::attention_dims(meta(0), meta(1), meta(2));
}

MT_REGISTER_OPS {
  // Forward: one tile of scores/probabilities, reused across heads.
  add_cpu_kernel(
      "attention",
      [](KernelContext& c) {
        const AttentionDims d = dims_of(c);
        if (d.batch * d.seq * d.heads_q == 0) return;  // empty: nothing to write
        MT_DISPATCH_FLOAT(c.out[0].dtype(), "attention", [&] {
          scalar_t* p = static_cast<scalar_t*>(c.workspace.raw());
          attention_forward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
                            out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1), p, d,
                            c.attrs().f("softmax_scale"), c.attrs().b("causal"));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return tile_bytes(in[0]);
      });
  // Backward: a tile of the probabilities P and one of their gradient dP.
  add_cpu_kernel(
      "attention_backward",
      [](KernelContext& c) {
        const AttentionDims d = dims_of(c);
        MT_DISPATCH_FLOAT(c.out[0].dtype(), "attention_backward", [&] {
          if (d.batch * d.seq * d.heads_q == 0) {
            std::fill_n(out_ptr<scalar_t>(c, 1), c.out[1].numel(), scalar_t(0));
            std::fill_n(out_ptr<scalar_t>(c, 2), c.out[2].numel(), scalar_t(0));
            return;
          }
          scalar_t* p = static_cast<scalar_t*>(c.workspace.raw());
          const int64_t tile = std::min(d.seq, kRowBlock) * d.seq;
          attention_backward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
                             in_ptr<scalar_t>(c, 3), in_ptr<scalar_t>(c, 4), in_ptr<scalar_t>(c, 5),
                             out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1),
                             out_ptr<scalar_t>(c, 2), p, p + tile, d, c.attrs().f("softmax_scale"),
                             c.attrs().b("causal"));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return 2 * tile_bytes(in[0]);
      });
}

}  // namespace
}  // namespace meshtrain::cpu
