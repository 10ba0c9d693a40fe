// grouped_matmul / grouped_matmul_wgrad: shape inference and the backward rule (its GEMMs keep the
// forward's kernel choice); and grouped_matmul_wgrad_accumulate, the weight gradient written into
// its float32 buffer.
#include "meshtrain/moe/grouped_matmul.h"

namespace meshtrain::ops {

void check_groups(const TensorMeta& g, int64_t experts, const char* op) {
  MT_CHECK_T(ShapeError, g.dtype == DType::kI32 && g.shape == Shape({2, experts}),
             "{}: groups must be int32 [2, {}] (start rows and counts per expert), found {} {}", op,
             experts, g.dtype, g.shape);
}

void check_group_rows(const int32_t* g, int64_t e, int64_t rows, const char* op) {
  int64_t end = 0;
  for (int64_t x = 0; x < e; ++x) {
    const int64_t start = g[x], count = g[e + x];
    MT_CHECK_T(ValueError, count >= 0 && start >= end && start + count <= rows,
               "{}: expert {} group [{}, {}) is not inside the buffer's {} rows after the previous "
               "group's end {}",
               op, x, start, start + count, rows, end);
    end = start + count;
  }
}

namespace {

std::vector<TensorMeta> infer_gmm(const std::vector<TensorMeta>& in, const Attrs& a) {
  MT_CHECK_T(ShapeError, in.size() == 3, "grouped_matmul takes (x, w, groups), found {} inputs",
             in.size());
  const TensorMeta& x = in[0];
  const TensorMeta& w = in[1];
  MT_CHECK_T(ShapeError, x.shape.rank() == 2 && is_floating(x.dtype),
             "grouped_matmul: x must be floating [C, K], found {} {}", x.dtype, x.shape);
  MT_CHECK_T(ShapeError, w.shape.rank() == 3 && w.dtype == x.dtype,
             "grouped_matmul: w must be {} [E, N, K] (or [E, K, N]), found {} {}", x.dtype, w.dtype,
             w.shape);
  const bool tw = a.b("transpose_w");
  const int64_t k = tw ? w.shape[2] : w.shape[1], n = tw ? w.shape[1] : w.shape[2];
  MT_CHECK_T(ShapeError, k == x.shape[1],
             "grouped_matmul: inner dimensions differ: x {} has K = {}, w {}{} has K = {}", x.shape,
             x.shape[1], w.shape, tw ? " (used transposed)" : "", k);
  check_groups(in[2], w.shape[0], "grouped_matmul");
  return {{Shape{x.shape[0], n}, x.dtype}};
}

std::vector<TensorMeta> infer_wgrad(const std::vector<TensorMeta>& in, const Attrs&) {
  MT_CHECK_T(ShapeError, in.size() == 3,
             "grouped_matmul_wgrad takes (a, b, groups), found {} inputs", in.size());
  const TensorMeta& a = in[0];
  const TensorMeta& b = in[1];
  MT_CHECK_T(ShapeError,
             a.shape.rank() == 2 && b.shape.rank() == 2 && a.dtype == b.dtype &&
                 is_floating(a.dtype) && a.shape[0] == b.shape[0],
             "grouped_matmul_wgrad: a [C, P] and b [C, Q] must share C and a floating dtype, "
             "found {} {} and {} {}",
             a.dtype, a.shape, b.dtype, b.shape);
  MT_CHECK_T(ShapeError, in[2].shape.rank() == 2,
             "grouped_matmul_wgrad: groups must be [2, E], found {}", in[2].shape);
  const int64_t e = in[2].shape[1];
  check_groups(in[2], e, "grouped_matmul_wgrad");
  return {{Shape{e, a.shape[1], b.shape[1]}, a.dtype}};
}

// (dst, a, b, groups): dst must hold wgrad's [E, P, Q] in float32 for bf16 operands, else in the
// operands' dtype.
std::vector<TensorMeta> infer_wgrad_accumulate(const std::vector<TensorMeta>& in, const Attrs& at) {
  MT_CHECK_T(ShapeError, in.size() == 4,
             "grouped_matmul_wgrad_accumulate takes (dst, a, b, groups), found {} inputs",
             in.size());
  const TensorMeta product = infer_wgrad({in[1], in[2], in[3]}, at).at(0);
  const TensorMeta& dst = in[0];
  MT_CHECK_T(ShapeError, dst.shape.numel() == product.shape.numel(),
             "grouped_matmul_wgrad_accumulate: the destination {} holds {} elements, the "
             "product {} holds {}",
             dst.shape, dst.shape.numel(), product.shape, product.shape.numel());
  MT_CHECK_T(
      ValueError,
      dst.dtype == product.dtype || (product.dtype == DType::kBF16 && dst.dtype == DType::kF32),
      "grouped_matmul_wgrad_accumulate: a {} destination for {} operands (expected the "
      "operands' dtype, or float32 for bfloat16 operands)",
      dst.dtype, product.dtype);
  return {};
}

}  // namespace

const char* expert_gemm_kernel_name(ExpertGemmKernel k) {
  switch (k) {
    case ExpertGemmKernel::kAuto: return "auto";
    case ExpertGemmKernel::kCublas: return "cublas";
    case ExpertGemmKernel::kMeshtrain: return "meshtrain";
  }
  return "auto";
}

// Graphs built before the attribute existed (and tests that build nodes by hand) carry none.
ExpertGemmKernel expert_gemm_kernel_of(const Attrs& attrs) {
  return attrs.has("kernel") ? ExpertGemmKernel(attrs.i("kernel")) : ExpertGemmKernel::kAuto;
}

ValueId grouped_matmul(Builder& b, ValueId x, ValueId w, ValueId groups, bool transpose_w,
                       ExpertGemmKernel kernel) {
  return b.op1("grouped_matmul", {x, w, groups},
               {{"transpose_w", int64_t(transpose_w)}, {"kernel", int64_t(kernel)}});
}

ValueId grouped_matmul_wgrad(Builder& b, ValueId a, ValueId bm, ValueId groups,
                             ExpertGemmKernel kernel) {
  return b.op1("grouped_matmul_wgrad", {a, bm, groups}, {{"kernel", int64_t(kernel)}});
}

void grouped_matmul_wgrad_accumulate(Builder& b, ValueId dst, ValueId a, ValueId bm, ValueId groups,
                                     bool overwrite, ExpertGemmKernel kernel) {
  b.op(kGroupedWgradAccumulateOp, {dst, a, bm, groups},
       {{"overwrite", int64_t(overwrite)}, {"kernel", int64_t(kernel)}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "grouped_matmul",
            .infer = infer_gmm,
            .backward =
                [](GradContext& c) {
                  const bool tw = c.attrs().b("transpose_w");
                  const ExpertGemmKernel k = expert_gemm_kernel_of(c.attrs());
                  std::vector<ValueId> g(3, kNoValue);
                  if (c.needs_grad[0])
                    g[0] = grouped_matmul(c.b, c.grad_out(0), c.in(1), c.in(2), !tw, k);
                  // y_e = x_e w_eᵀ: dw_e = dy_eᵀ x_e; y_e = x_e w_e: dw_e = x_eᵀ dy_e.
                  if (c.needs_grad[1])
                    g[1] = tw ? grouped_matmul_wgrad(c.b, c.grad_out(0), c.in(0), c.in(2), k)
                              : grouped_matmul_wgrad(c.b, c.in(0), c.grad_out(0), c.in(2), k);
                  return g;
                },
            .compute_heavy = true});
  r.add_op({.name = "grouped_matmul_wgrad",
            .infer = infer_wgrad,
            .compute_heavy = true,
            .accumulating_form = kGroupedWgradAccumulateOp});
  // A gradient sink like matmul_accumulate (no outputs, not differentiable); the cost model
  // counts 2 · C · P · Q (every routed row once).
  r.add_op({.name = kGroupedWgradAccumulateOp,
            .infer = infer_wgrad_accumulate,
            .side_effect = true,
            .compute_heavy = true,
            .flops = [](const std::vector<TensorMeta>& in, const Attrs&) {
              return 2 * in.at(1).shape[0] * in.at(1).shape[1] * in.at(2).shape[1];
            }});
}

}  // namespace meshtrain::ops
