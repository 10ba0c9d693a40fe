// DeepSeek-V3 layer builders: Multi-head Latent Attention and the MoE block, on given weights,
// following torchtitan's deepseek_v3 Attention.forward and moe.MoE.forward step for step.
#include <cmath>

#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/moe/combine.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/rmsnorm.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/ops/swiglu.h"

namespace meshtrain {

ops::RouterConfig DeepSeekV3MoEArgs::router_config() const {
  return {.score_func = score_func,
          .top_k = top_k,
          .num_expert_groups = num_expert_groups,
          .num_limited_groups = num_limited_groups,
          .route_norm = route_norm,
          .route_scale = route_scale};
}

DType router_dtype(DType compute_dtype) {
  return compute_dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

double DeepSeekV3Args::softmax_scale(int64_t seq_len) const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  if (ops::yarn_applies(rope_config(), seq_len)) {
    const double m = ops::yarn_mscale(rope_factor, mscale);
    scale *= m * m;
  }
  return scale;
}

ops::RopeConfig DeepSeekV3Args::rope_config() const {
  ops::RopeConfig c;
  c.scaling = "yarn";
  c.theta = rope_theta;
  c.rope_factor = rope_factor;
  c.beta_fast = beta_fast;
  c.beta_slow = beta_slow;
  c.original_seq_len = original_seq_len;
  c.yarn_apply = yarn_apply;  // unset: YaRN applies when the table's seq_len > original_seq_len
  return c;
}

ValueId mla_forward(Builder& b, const DeepSeekV3Args& a, const MlaWeights& w, ValueId x,
                    ValueId table, int64_t seq_len, int64_t heads) {
  const int64_t B = b.shape(x)[0], S = seq_len, H = heads > 0 ? heads : a.n_heads;
  const int64_t nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim, vd = a.v_head_dim;
  const int64_t qk = a.qk_head_dim();
  ValueId q;
  if (a.q_lora_rank == 0) {
    q = ops::linear(b, x, w.wq);
  } else {
    q = ops::linear(b, ops::rmsnorm(b, ops::linear(b, x, w.wq_a), w.q_norm, a.norm_eps), w.wq_b);
  }
  // Each head is [q_nope | q_pe]: rope rotates the q_pe tail in place (no slices, no concat).
  q = ops::rope(b, ops::reshape(b, q, Shape{B, S, H, qk}), table, false, nope);

  // One compressed latent (kv_lora_rank) plus one rope key shared by all heads.
  ValueId kv = ops::linear(b, x, w.wkv_a);  // [B, S, kv_lora_rank + rope]
  ValueId latent = ops::slice(b, kv, -1, 0, a.kv_lora_rank);
  ValueId k_pe = ops::reshape(b, ops::slice(b, kv, -1, a.kv_lora_rank, rope), Shape{B, S, 1, rope});
  k_pe = ops::expand(b, ops::rope(b, k_pe, table), 2, H);
  kv = ops::linear(b, ops::rmsnorm(b, latent, w.kv_norm, a.norm_eps), w.wkv_b);
  kv = ops::reshape(b, kv, Shape{B, S, H, nope + vd});
  ValueId k = ops::concat(b, {ops::slice(b, kv, -1, 0, nope), k_pe}, -1);
  ValueId v = ops::slice(b, kv, -1, nope, vd);

  ValueId o =
      ops::attention(b, q, k, v, a.softmax_scale(S), true, a.attention_kernel).out;  // [B, S, H, v]
  return ops::linear(b, ops::reshape(b, o, Shape{B, S, H * vd}), w.wo);
}

MoeOutputs moe_forward(Builder& b, const DeepSeekV3Args& a, const MoeWeights& w, ValueId x,
                       const ParallelPlan* plan) {
  const bool ep = plan && plan->group_size(MeshGroup::kEp) > 1;
  const DeepSeekV3MoEArgs& m = a.moe;
  const DType rdt = router_dtype(b.dtype(x));
  MoeOutputs out;
  ops::RouterOutputs r;
  {
    auto s = b.scope("router");
    ValueId logits = ops::linear(b, ops::cast(b, x, rdt), w.gate);  // [T, E] in float32
    r = ops::router(b, logits, w.expert_bias, m.router_config());
  }
  out.ids = r.ids;
  // Routed experts: expert-major rows (the place an expert-parallel token dispatch goes),
  // SwiGLU over grouped GEMMs, and the weighted combine back to token order.
  ValueId routed;
  {
    auto s = b.scope("experts");
    // With expert parallelism the rows are first grouped unpadded (each EP rank's block is then
    // contiguous); the local buffer after the exchange is padded to the alignment.
    ops::DispatchPlan dp =
        ops::moe_dispatch_plan(b, r.ids, m.num_experts, ep ? 1 : m.token_group_alignment);
    ValueId xp = ops::moe_permute(b, x, dp, m.score_before_experts ? r.weights : kNoValue);
    ExpertRows rows{xp, dp.groups};
    if (ep) rows = plan->to_local_experts(b, xp, dp.groups, dp.capacity, m.token_group_alignment);
    const ops::ExpertGemmKernel k = m.expert_gemm_kernel;
    ValueId h = ops::swiglu(b, ops::grouped_matmul(b, rows.x, w.w1, rows.groups, true, k),
                            ops::grouped_matmul(b, rows.x, w.w3, rows.groups, true, k));
    ValueId y = ops::grouped_matmul(b, h, w.w2, rows.groups, true, k);
    if (ep) y = plan->from_local_experts(b, y, rows, dp.groups, dp.capacity);
    routed = ops::moe_combine(b, y, dp.row_map, m.score_before_experts ? kNoValue : r.weights);
  }
  if (m.num_shared_experts == 0 || w.shared_w1 == kNoValue) {
    out.out = routed;
    return out;
  }
  auto s = b.scope("shared_experts");
  out.out = ops::add(b, swiglu_mlp(b, x, w.shared_w1, w.shared_w2, w.shared_w3), routed);
  return out;
}

}  // namespace meshtrain
