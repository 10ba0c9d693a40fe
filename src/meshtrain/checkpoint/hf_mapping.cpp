// The name rules of torchtitan's llama3 and deepseek_v3 state-dict adapters (meshtrain keeps
// torchtitan's parameter names), applied to the parameters a plan declared.
#include "meshtrain/checkpoint/hf_mapping.h"

#include <optional>

#include "meshtrain/core/block_name.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/model/llama3.h"

namespace meshtrain {

namespace {

// meshtrain suffix (after "layers.N.") -> HF suffix (after "model.layers.N."): the names both
// families share, then each family's own.
using NameMap = std::map<std::string, std::string>;
NameMap with_common(NameMap own) {
  own.insert({{"attention.wo.weight", "self_attn.o_proj.weight"},
              {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
              {"feed_forward.w3.weight", "mlp.up_proj.weight"},
              {"feed_forward.w2.weight", "mlp.down_proj.weight"},
              {"attention_norm.weight", "input_layernorm.weight"},
              {"ffn_norm.weight", "post_attention_layernorm.weight"},
              {"attention.wq.weight", "self_attn.q_proj.weight"}});
  return own;
}

const NameMap& llama_layer_names() {
  static const NameMap m = with_common({{"attention.wk.weight", "self_attn.k_proj.weight"},
                                        {"attention.wv.weight", "self_attn.v_proj.weight"}});
  return m;
}

const NameMap& deepseek_layer_names() {
  static const NameMap m = with_common({
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
  });
  return m;
}

// Stacked expert weights: meshtrain suffix -> HF per-expert suffix (after "mlp.experts.E.").
const std::map<std::string, std::string>& expert_names() {
  static const std::map<std::string, std::string> m = {
      {"moe.experts.w1", "gate_proj.weight"},
      {"moe.experts.w3", "up_proj.weight"},
      {"moe.experts.w2", "down_proj.weight"},
  };
  return m;
}

const std::map<std::string, std::string>& root_names() {
  static const std::map<std::string, std::string> m = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  return m;
}

// Not part of the model's HF state: the routing counters of the load balancing.
bool is_counter(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends(".tokens_per_expert") || ends(".tokens_per_expert_last_step");
}

}  // namespace

int64_t hf_row_of_meta_row(int64_t row, int64_t head_dim) {
  const int64_t head = row / head_dim, r = row % head_dim;
  return head * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

HfLayout::HfLayout(const Model& model, const std::vector<ParamInfo>& params)
    : model_name_(model.name()) {
  const Llama3Args* llama = llama3_args_of(model);
  MT_CHECK_T(ConfigError, llama || deepseek_v3_args_of(model),
             "model {} has no Hugging Face layout (llama3 and deepseek_v3 have)", model.name());
  const auto& layer_names = llama ? llama_layer_names() : deepseek_layer_names();
  // HF order: embedding, then layer by layer, then the final norm and the head.
  std::vector<std::pair<std::pair<int, int>, HfTensor>> ordered;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    if (is_counter(p.name)) continue;
    const std::vector<int64_t> shape(p.global_shape.dims().begin(), p.global_shape.dims().end());
    auto push = [&](int rank_in_order, HfTensor t) {
      ordered.push_back({{rank_in_order, int(ordered.size())}, std::move(t)});
    };
    if (auto it = root_names().find(p.name); it != root_names().end()) {
      push(p.name == "tok_embeddings.weight" ? -1 : 1 << 30,
           HfTensor{.hf_name = it->second, .param = p.name, .shape = shape});
      continue;
    }
    const std::optional<ParsedBlockName> in_block = parse_block_name(p.name);
    MT_CHECK(in_block && !in_block->suffix.empty(), "parameter {} has no Hugging Face name",
             p.name);
    const int l = in_block->index;
    const std::string& rest = in_block->suffix;
    // HF nests the same block names under "model.": "model.layers.N.".
    const std::string prefix = "model." + block_name(l) + ".";
    if (auto it = expert_names().find(rest); !llama && it != expert_names().end()) {
      for (int64_t e = 0; e < shape[0]; ++e)
        push(l, HfTensor{.hf_name = fmt::format("{}mlp.experts.{}.{}", prefix, e, it->second),
                         .param = p.name,
                         .shape = {shape[1], shape[2]},
                         .expert = e});
      continue;
    }
    auto it = layer_names.find(rest);
    MT_CHECK(it != layer_names.end(), "parameter {} has no Hugging Face name", p.name);
    HfTensor t{.hf_name = prefix + it->second, .param = p.name, .shape = shape};
    if (llama && rest == "attention.wq.weight") t.rope_heads = llama->n_heads;
    if (llama && rest == "attention.wk.weight") t.rope_heads = llama->kv_heads();
    t.may_be_absent = rest == "moe.expert_bias";
    push(l, std::move(t));
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, t] : ordered) {
    by_hf_[t.hf_name] = tensors_.size();
    by_param_[t.param].push_back(tensors_.size());
    tensors_.push_back(std::move(t));
  }
}

const HfTensor* HfLayout::find(const std::string& hf_name) const {
  auto it = by_hf_.find(hf_name);
  return it == by_hf_.end() ? nullptr : &tensors_[it->second];
}

HfRow HfLayout::locate(const std::string& param, int64_t lead, int64_t row) const {
  auto it = by_param_.find(param);
  MT_CHECK(it != by_param_.end(), "parameter {} has no Hugging Face tensor", param);
  const HfTensor& t = tensors_[it->second[size_t(it->second.size() > 1 ? lead : 0)]];
  MT_CHECK(t.expert < 0 || t.expert == lead, "{}: expert {} maps to {}", param, lead, t.hf_name);
  if (t.rope_heads > 0) return {&t, hf_row_of_meta_row(row, t.shape[0] / t.rope_heads)};
  return {&t, row};
}

void for_each_piece_row(const HfLayout& layout, const ParamInfo& p,
                        const std::function<void(int64_t, const HfRow&, int64_t, int64_t)>& f) {
  const Shape& g = p.global_shape;
  const Shape& ls = p.local_shape;
  const int rank = g.rank();
  const int64_t c0 = p.piece.at(rank - 1);
  const int64_t c1 = std::min(c0 + ls[rank - 1], p.piece.limit_at(rank - 1, g[rank - 1]));
  if (c1 <= c0) return;
  std::vector<int64_t> idx(size_t(rank - 1), 0), gi(size_t(rank - 1));
  for (int64_t r = 0; r < ls.rows(); ++r) {
    bool padding = false;
    for (size_t d = 0; d < idx.size(); ++d) {
      gi[d] = p.piece.at(int(d)) + idx[d];
      padding |= gi[d] >= p.piece.limit_at(int(d), g[int(d)]);
    }
    if (!padding)
      f(r,
        layout.locate(p.name, rank == 3 ? gi[0] : 0,
                      rank == 3   ? gi[1]
                      : rank == 2 ? gi[0]
                                  : 0),
        c0, c1);
    for (int d = int(idx.size()) - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < ls[d]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace meshtrain
