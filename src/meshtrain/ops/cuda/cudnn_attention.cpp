// cuDNN fused SDPA through the backend API: builds the operation graph cuDNN's runtime-fusion SDPA
// engines recognise (matmul, scale, causal select, softmax with stats, matmul; and the backward's
// dO·O row sums, recomputed P, dV, dS, dK, dQ), finalises one plan per shape and caches it.
// Every cuDNN call is checked: a failure names the call, its status and cuDNN's last message.
#include "meshtrain/ops/cuda/cudnn_attention.h"

#include <cudnn_graph.h>

#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {
namespace {

void check_cudnn(cudnnStatus_t st, const char* call, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  MT_THROW(CudaError, "cuDNN attention: {}({}) failed: {} ({}){}{}", call, what,
           cudnnGetErrorString(st), int(st), last[0] ? ": " : "", last);
}
#define MT_CUDNN(call, what) check_cudnn((call), #call, what)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor", "");
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc() = default;
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
         cudnnBackendAttributeType_t t, int64_t n, const void* v, const char* name) {
  check_cudnn(cudnnBackendSetAttribute(d, attr, t, n, v), "cudnnBackendSetAttribute", name);
}
#define MT_SET(d, attr, type, n, v) set((d), attr, type, (n), (v), #attr)

void finalize(cudnnBackendDescriptor_t d, const char* what) {
  check_cudnn(cudnnBackendFinalize(d), "cudnnBackendFinalize", what);
}

using Dims = std::vector<int64_t>;

// Tensor UIDs of the variant pack.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kOne,
  kDQAccum,
  kFirstVirtual = 100
};

// Builds one operation graph: tensors and operations are kept alive until the plan is final.
class GraphBuilder {
 public:
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims,
                                  const Dims& strides, bool is_virtual, bool by_value = false) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    MT_SET(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    MT_SET(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()),
           dims.data());
    MT_SET(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()),
           strides.data());
    MT_SET(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    MT_SET(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (is_virtual) {
      const bool yes = true;
      MT_SET(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    if (by_value) {
      const bool yes = true;
      MT_SET(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    finalize(t.get(), "tensor");
    keep_.push_back(std::move(t));
    return keep_.back().get();
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, dt, dims, strides, true);
  }
  // A by-value fp32 scalar: one descriptor per UID however many operations read it.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    auto it = scalars_.find(uid);
    if (it != scalars_.end()) return it->second;
    return scalars_[uid] = tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    MT_SET(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(mm.get(), "matmul");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    auto* mmd = mm.get();
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd);
    finalize(op.get(), "matmul operation");
    keep_.push_back(std::move(mm));
    add_op(std::move(op));
  }

  // y = mode(x, b, t); b and t may be null. `axis` is GEN_INDEX's.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    MT_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    MT_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) MT_SET(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw.get(), "pointwise");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    auto* pwd = pw.get();
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &pwd);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b)
      MT_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t)
      MT_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op.get(), "pointwise operation");
    keep_.push_back(std::move(pw));
    add_op(std::move(op));
  }

  void reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    MT_SET(rd.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
    MT_SET(rd.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(rd.get(), "reduction");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    auto* rdd = rd.get();
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rdd);
    finalize(op.get(), "reduction operation");
    keep_.push_back(std::move(rd));
    add_op(std::move(op));
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    MT_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op.get(), "reshape operation");
    add_op(std::move(op));
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return op_handles_; }

 private:
  void add_op(Desc op) {
    op_handles_.push_back(op.get());
    keep_.push_back(std::move(op));
  }
  std::vector<Desc> keep_;
  std::vector<cudnnBackendDescriptor_t> op_handles_;
  std::map<int64_t, cudnnBackendDescriptor_t> scalars_;
  int64_t next_virtual_ = kFirstVirtual;
};

// The extents of one problem in cuDNN's [B, H, S, D] view of meshtrain's [B, S, H, D] memory.
struct View {
  int64_t b, h, s, dqk, dv;
  Dims bhsd(int64_t d) const { return {b, h, s, d}; }
  Dims bhsd_strides(int64_t d) const { return {s * h * d, d, h * d, 1}; }
  Dims bhds(int64_t d) const { return {b, h, d, s}; }  // K or V transposed, same memory
  Dims bhds_strides(int64_t d) const { return {s * h * d, d, 1, h * d}; }
  Dims scores() const { return {b, h, s, s}; }
  Dims scores_strides() const { return {h * s * s, s * s, s, 1}; }
  Dims scores_t_strides() const { return {h * s * s, s * s, 1, s}; }
  Dims rows() const { return {b, h, s, 1}; }
  Dims rows_strides() const { return {h * s, s, 1, 1}; }
};

// scale·QKᵀ with the causal mask applied (masked scores -inf): fp32, virtual.
cudnnBackendDescriptor_t scaled_masked_scores(GraphBuilder& g, const View& v, bool causal,
                                              cudnnBackendDescriptor_t q,
                                              cudnnBackendDescriptor_t kt) {
  auto f32 = [&] { return g.virt(CUDNN_DATA_FLOAT, v.scores(), v.scores_strides()); };
  auto s = f32();
  g.matmul(q, kt, s);
  auto scaled = f32();
  g.pointwise(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), nullptr, scaled);
  if (!causal) return scaled;
  auto row = g.virt(CUDNN_DATA_INT32, v.scores(), v.scores_strides());
  auto col = g.virt(CUDNN_DATA_INT32, v.scores(), v.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, v.scores(), v.scores_strides());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  auto masked = f32();
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, g.scalar(kNegInf), keep, masked);
  return masked;
}

void build_forward(GraphBuilder& g, const View& v, bool causal) {
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, v.bhsd(v.dqk), v.bhsd_strides(v.dqk), false);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, v.bhds(v.dqk), v.bhds_strides(v.dqk), false);
  auto val = g.tensor(kV, CUDNN_DATA_BFLOAT16, v.bhsd(v.dv), v.bhsd_strides(v.dv), false);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, v.bhsd(v.dv), v.bhsd_strides(v.dv), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, v.rows(), v.rows_strides(), false);
  auto s = scaled_masked_scores(g, v, causal, q, kt);
  auto row_f32 = [&] { return g.virt(CUDNN_DATA_FLOAT, v.rows(), v.rows_strides()); };
  auto full_f32 = [&] { return g.virt(CUDNN_DATA_FLOAT, v.scores(), v.scores_strides()); };
  // softmax with stats = max + log(sum exp(s - max)): the natural-log LSE meshtrain's kernels save.
  auto mx = row_f32();
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, mx);
  auto centred = full_f32();
  g.pointwise(CUDNN_POINTWISE_SUB, s, mx, nullptr, centred);
  auto e = full_f32();
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, nullptr, e);
  auto sum = row_f32();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  auto log_sum = row_f32();
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, log_sum, nullptr, stats);
  // P in the I/O type: the engines take the second matmul's A operand as bf16.
  auto p = g.virt(CUDNN_DATA_BFLOAT16, v.scores(), v.scores_strides());
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, p);
  g.matmul(p, val, o);
}

void build_backward(GraphBuilder& g, const View& v, bool causal, CudnnBwdMode mode) {
  auto bf16 = CUDNN_DATA_BFLOAT16;
  auto q = g.tensor(kQ, bf16, v.bhsd(v.dqk), v.bhsd_strides(v.dqk), false);
  auto kt = g.tensor(kK, bf16, v.bhds(v.dqk), v.bhds_strides(v.dqk), false);
  auto vt = g.tensor(kV, bf16, v.bhds(v.dv), v.bhds_strides(v.dv), false);
  auto o = g.tensor(kO, bf16, v.bhsd(v.dv), v.bhsd_strides(v.dv), false);
  auto d_o = g.tensor(kDO, bf16, v.bhsd(v.dv), v.bhsd_strides(v.dv), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, v.rows(), v.rows_strides(), false);
  auto dq = g.tensor(kDQ, bf16, v.bhsd(v.dqk), v.bhsd_strides(v.dqk), false);
  auto dk = g.tensor(kDK, bf16, v.bhsd(v.dqk), v.bhsd_strides(v.dqk), false);
  auto dv = g.tensor(kDV, bf16, v.bhsd(v.dv), v.bhsd_strides(v.dv), false);
  auto full_f32 = [&] { return g.virt(CUDNN_DATA_FLOAT, v.scores(), v.scores_strides()); };

  // D = rowsum(dO * O), kept in the workspace (fp32 [B,H,S,1]).
  auto prod = g.virt(CUDNN_DATA_FLOAT, v.bhsd(v.dv), v.bhsd_strides(v.dv));
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, nullptr, prod);
  auto rowsum = g.virt(CUDNN_DATA_FLOAT, v.rows(), v.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  auto delta = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, v.rows(), v.rows_strides(), false);
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, g.scalar(kOne), nullptr, delta);

  // P = exp(scale·QKᵀ - lse); dV = Pᵀ dO.
  auto s = scaled_masked_scores(g, v, causal, q, kt);
  auto centred = full_f32();
  g.pointwise(CUDNN_POINTWISE_SUB, s, stats, nullptr, centred);
  auto p = full_f32();
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, nullptr, p);
  auto pt = g.virt(bf16, v.scores(), v.scores_t_strides());
  g.reshape(p, pt);
  g.matmul(pt, d_o, dv);

  // dS = scale · P ∘ (dO Vᵀ - D); dK = dSᵀ Q; dQ = dS K.
  auto dp = full_f32();
  g.matmul(d_o, vt, dp);
  auto dp_centred = full_f32();
  g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, nullptr, dp_centred);
  auto ds_unscaled = full_f32();
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, nullptr, ds_unscaled);
  auto ds = full_f32();
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, g.scalar(kScale), nullptr, ds);
  auto dst = g.virt(bf16, v.scores(), v.scores_t_strides());
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  auto k = g.virt(bf16, v.bhsd(v.dqk), v.bhsd_strides(v.dqk));
  g.reshape(kt, k);
  if (mode == CudnnBwdMode::kDeterministic) {
    g.matmul(ds, k, dq);
  } else {
    const int64_t d = v.dqk;
    auto acc =
        g.tensor(kDQAccum, CUDNN_DATA_FLOAT, v.bhsd(d), {v.h * v.s * d, v.s * d, d, 1}, false);
    g.matmul(ds, k, acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct Plan {
  Desc plan;
  CudnnAttnPlanInfo info;
  // Offsets inside the caller's workspace of meshtrain-owned tensors (after cuDNN's scratch).
  size_t softmax_sum_offset = 0, dq_accum_offset = 0, dq_accum_bytes = 0;
};

// Plans per device: a cudnnHandle_t is bound to the device current when it was made.
struct DeviceState {
  cudnnHandle_t handle = nullptr;
  std::map<std::tuple<bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, bool>,
           std::unique_ptr<Plan>>
      plans;
};
std::mutex g_mutex;
std::map<int, DeviceState>& devices() {
  static auto* d = new std::map<int, DeviceState>();  // never destroyed: handles outlive exit
  return *d;
}

// The heuristics' engine configs, best first; the first that finalises wins.
void finalize_plan(cudnnHandle_t handle, GraphBuilder& g, Plan& plan, const char* what) {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const auto& ops = g.ops();
  MT_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
         int64_t(ops.size()), ops.data());
  MT_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  finalize(graph.get(), what);
  std::string failures;
  for (cudnnBackendHeurMode_t hm : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    auto* gd = graph.get();
    MT_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &gd);
    MT_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) {
      char last[512] = {0};
      cudnnGetLastErrorString(last, sizeof(last));
      failures += fmt::format(" [heuristics mode {}: {}]", int(hm), last);
      continue;
    }
    int64_t count = 0;
    MT_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
             "CUDNN_ATTR_ENGINEHEUR_RESULTS count");
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (count > 0)
      MT_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
               "CUDNN_ATTR_ENGINEHEUR_RESULTS");
    for (int64_t i = 0; i < got; ++i) {
      Desc p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      MT_SET(p.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &raw[size_t(i)]);
      MT_SET(p.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (cudnnBackendFinalize(p.get()) != CUDNN_STATUS_SUCCESS) {
        char last[512] = {0};
        cudnnGetLastErrorString(last, sizeof(last));
        failures += fmt::format(" [config {}: {}]", i, last);
        continue;
      }
      int64_t ws = 0, n = 0;
      MT_CUDNN(cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                        CUDNN_TYPE_INT64, 1, &n, &ws),
               "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
      // The engine behind the config: its global index and whether it is nondeterministic.
      Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      auto* ed = engine.get();
      MT_CUDNN(cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &ed),
               "CUDNN_ATTR_ENGINECFG_ENGINE");
      MT_CUDNN(cudnnBackendGetAttribute(ed, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                        &plan.info.engine),
               "CUDNN_ATTR_ENGINE_GLOBAL_INDEX");
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      int64_t n_notes = 0;
      if (cudnnBackendGetAttribute(ed, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_notes,
                                   notes) == CUDNN_STATUS_SUCCESS)
        for (int64_t j = 0; j < n_notes; ++j)
          if (notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) plan.info.nondeterministic = true;
      plan.info.plan_workspace = size_t(ws);
      plan.plan = std::move(p);
      return;
    }
  }
  MT_THROW(CudaError, "cuDNN attention: no engine finalised the {} graph (cuDNN {}):{}", what,
           cudnnGetVersion(),
           failures.empty() ? " heuristics returned no engine config" : failures);
}

void check_shape(const AttnShape& s) {
  MT_CHECK_T(ValueError, s.heads_q == s.heads_kv,
             "cuDNN attention: heads_kv ({}) must equal heads_q ({}): GQA is not built", s.heads_kv,
             s.heads_q);
  MT_CHECK_T(ValueError, s.dim_qk % 8 == 0 && s.dim_v % 8 == 0 && s.dim_qk <= 256 && s.dim_v <= 256,
             "cuDNN attention: head dims must be multiples of 8 up to 256, found ({}, {})",
             s.dim_qk, s.dim_v);
  MT_CHECK_T(ValueError, s.batch > 0 && s.seq > 0 && s.heads_q > 0,
             "cuDNN attention: empty problem (batch {} seq {} heads {})", s.batch, s.seq,
             s.heads_q);
}

// The cached plan for the shape, built on first use (under the lock: plans build once).
Plan& plan_for(const AttnShape& s, bool backward, CudnnBwdMode mode) {
  check_shape(s);
  // cuDNN up to 9.15 needs a padding-mask workaround in the backward when S is not a multiple of
  // 128 (the frontend adds one); this graph has none, so refuse rather than compute wrong grads.
  MT_CHECK_T(ValueError, !backward || s.seq % 128 == 0 || cudnnGetVersion() > 91500,
             "cuDNN attention: the backward at S {} (not a multiple of 128) needs cuDNN > 9.15, "
             "found {}",
             s.seq, cudnnGetVersion());
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& st = devices()[dev];
  if (!st.handle) MT_CUDNN(cudnnCreate(&st.handle), "");
  const auto key =
      std::make_tuple(backward, int(mode), s.batch, s.seq, s.heads_q, s.dim_qk, s.dim_v, s.causal);
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return *it->second;
  const View v{s.batch, s.heads_q, s.seq, s.dim_qk, s.dim_v};
  auto plan = std::make_unique<Plan>();
  GraphBuilder g;
  if (backward)
    build_backward(g, v, s.causal, mode);
  else
    build_forward(g, v, s.causal);
  const std::string what =
      fmt::format("{} B {} S {} H {} ({}, {}){}{}", backward ? "backward" : "forward", s.batch,
                  s.seq, s.heads_q, s.dim_qk, s.dim_v, s.causal ? " causal" : "",
                  !backward                       ? ""
                  : mode == CudnnBwdMode::kAtomic ? " atomic dQ"
                                                  : " deterministic");
  finalize_plan(st.handle, g, *plan, what.c_str());
  size_t total = align256(plan->info.plan_workspace);
  if (backward) {
    plan->softmax_sum_offset = total;
    total += align256(size_t(s.batch * s.heads_q * s.seq) * sizeof(float));
    if (mode == CudnnBwdMode::kAtomic) {
      plan->dq_accum_offset = total;
      plan->dq_accum_bytes = size_t(s.batch * s.heads_q * s.seq * s.dim_qk) * sizeof(float);
      total += align256(plan->dq_accum_bytes);
    }
  }
  plan->info.workspace = total;
  return *st.plans.emplace(key, std::move(plan)).first->second;
}

cudnnHandle_t handle_on(cudaStream_t stream) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(g_mutex);
  cudnnHandle_t h = devices()[dev].handle;
  MT_CUDNN(cudnnSetStream(h, stream), "");
  return h;
}

void execute(const Plan& plan, const AttnShape& s, std::vector<int64_t> uids,
             std::vector<void*> ptrs, void* workspace, size_t workspace_bytes,
             cudaStream_t stream) {
  MT_CHECK_T(ValueError, workspace_bytes >= plan.info.workspace,
             "cuDNN attention: workspace of {} bytes, the plan needs {}", workspace_bytes,
             plan.info.workspace);
  // By-value scalars: the variant pack points at host values, read during the call.
  float scale = float(s.scale);
  float neg_inf = cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                            : -std::numeric_limits<float>::infinity();
  uids.push_back(kScale);
  ptrs.push_back(&scale);
  if (s.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  cudnnHandle_t h = handle_on(stream);
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  MT_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()),
         uids.data());
  MT_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
         int64_t(ptrs.size()), ptrs.data());
  MT_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  finalize(pack.get(), "variant pack");
  MT_CUDNN(cudnnBackendExecute(h, plan.plan.get(), pack.get()), "");
}

}  // namespace

int64_t cudnn_attention_version() { return int64_t(cudnnGetVersion()); }

CudnnAttnPlanInfo cudnn_attention_fwd_plan(const AttnShape& s) {
  return plan_for(s, false, CudnnBwdMode::kDeterministic).info;
}

CudnnAttnPlanInfo cudnn_attention_bwd_plan(const AttnShape& s, CudnnBwdMode mode) {
  return plan_for(s, true, mode).info;
}

void cudnn_attention_fwd(const AttnShape& s, const void* q, const void* k, const void* v, void* out,
                         float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const Plan& plan = plan_for(s, false, CudnnBwdMode::kDeterministic);
  execute(plan, s, {kQ, kK, kV, kO, kStats},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse}, workspace,
          workspace_bytes, stream);
}

void cudnn_attention_bwd(const AttnShape& s, const void* q, const void* k, const void* v,
                         const void* out, const float* lse, const void* dout, void* dq, void* dk,
                         void* dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         CudnnBwdMode mode) {
  const Plan& plan = plan_for(s, true, mode);
  auto* ws = static_cast<char*>(workspace);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne};
  static float one = 1.0f;  // by value: read by cudnnBackendExecute on the host
  std::vector<void*> ptrs{const_cast<void*>(q),
                          const_cast<void*>(k),
                          const_cast<void*>(v),
                          const_cast<void*>(out),
                          const_cast<float*>(lse),
                          const_cast<void*>(dout),
                          dq,
                          dk,
                          dv,
                          ws + plan.softmax_sum_offset,
                          &one};
  if (mode == CudnnBwdMode::kAtomic) {
    // Before cuDNN 9.6 the caller zeroes the fp32 dQ accumulator; later versions do it themselves.
    if (cudnnGetVersion() < 90600)
      CUDA_CHECK(cudaMemsetAsync(ws + plan.dq_accum_offset, 0, plan.dq_accum_bytes, stream));
    uids.push_back(kDQAccum);
    ptrs.push_back(ws + plan.dq_accum_offset);
  }
  execute(plan, s, std::move(uids), std::move(ptrs), workspace, workspace_bytes, stream);
}

namespace {

size_t fwd_workspace(const AttnShape& s) { return cudnn_attention_fwd_plan(s).workspace; }
size_t bwd_workspace(const AttnShape& s) { return cudnn_attention_bwd_plan(s).workspace; }
void bwd_deterministic(const AttnShape& s, const void* q, const void* k, const void* v,
                       const void* out, const float* lse, const void* dout, void* dq, void* dk,
                       void* dv, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  cudnn_attention_bwd(s, q, k, v, out, lse, dout, dq, dk, dv, workspace, workspace_bytes, stream,
                      CudnnBwdMode::kDeterministic);
}

// The attention op's CUDA kernels pick this up at prepare time (attention_kernels.h).
const AttentionLibrary kCudnnLibrary{"cudnn", fwd_workspace, bwd_workspace, cudnn_attention_fwd,
                                     bwd_deterministic};
const bool kRegistered = (register_attention_library(&kCudnnLibrary), true);

}  // namespace
}  // namespace meshtrain::cuda
