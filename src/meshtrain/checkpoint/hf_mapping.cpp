// The name rules of torchtitan's llama3 and deepseek_v3 state-dict adapters (meshtrain keeps
// torchtitan's parameter names) and of DeepSeek-V3's released MTP layers, applied to the
// parameters a plan declared.
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

// An MTP module's own tensors (meshtrain suffix -> HF suffix); the rest of the module is an
// ordinary decoder layer under the names above.
const NameMap& mtp_names() {
  static const NameMap m = {{"enorm.weight", "enorm.weight"},
                            {"hnorm.weight", "hnorm.weight"},
                            {"eh_proj.weight", "eh_proj.weight"},
                            {"final_norm.weight", "shared_head.norm.weight"}};
  return m;
}

// The shared weights of which the release stores a copy in every MTP layer: meshtrain's
// parameter -> HF suffix (after "model.layers.N.").
const std::vector<std::pair<std::string, std::string>>& mtp_copies() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"tok_embeddings.weight", "embed_tokens.weight"},
      {"output.weight", "shared_head.head.weight"}};
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

HfLayout::HfLayout(const Model& model, const std::vector<ParamInfo>& params, bool shared_copies)
    : model_name_(model.name()) {
  const Llama3Args* llama = llama3_args_of(model);
  const DeepSeekV3Args* deepseek = deepseek_v3_args_of(model);
  MT_CHECK_T(ConfigError, llama || deepseek,
             "model {} has no Hugging Face layout (llama3 and deepseek_v3 have)", model.name());
  const auto& layer_names = llama ? llama_layer_names() : deepseek_layer_names();
  // HF order: embedding, then layer by layer, then the final norm and the head, then the MTP
  // layers (the release's last shard holds them).
  constexpr int kTail = 1 << 30;
  std::vector<std::pair<std::pair<int, int>, HfTensor>> ordered;
  std::map<int, int> mtp_blocks;  // block index -> its place in the order
  std::map<std::string, std::vector<int64_t>> shapes;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const ParamInfo& p = params[pi];
    if (is_counter(p.name)) continue;
    const std::vector<int64_t> shape(p.global_shape.dims().begin(), p.global_shape.dims().end());
    shapes[p.name] = shape;
    auto push = [&](int rank_in_order, HfTensor t) {
      ordered.push_back({{rank_in_order, int(ordered.size())}, std::move(t)});
    };
    if (auto it = root_names().find(p.name); it != root_names().end()) {
      push(p.name == "tok_embeddings.weight" ? -1 : kTail,
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
    const bool mtp = deepseek && l >= deepseek->n_layers;
    const int order = mtp ? kTail + 1 + (l - deepseek->n_layers) : l;
    if (mtp) {
      mtp_blocks[l] = order;
      if (auto it = mtp_names().find(rest); it != mtp_names().end()) {
        push(order, HfTensor{.hf_name = prefix + it->second, .param = p.name, .shape = shape});
        continue;
      }
    }
    if (auto it = expert_names().find(rest); !llama && it != expert_names().end()) {
      for (int64_t e = 0; e < shape[0]; ++e)
        push(order, HfTensor{.hf_name = fmt::format("{}mlp.experts.{}.{}", prefix, e, it->second),
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
    push(order, std::move(t));
  }
  mtp_layers_ = int(mtp_blocks.size());
  // The release's copies of the shared embedding and head in each MTP layer. They may be absent
  // from a folder (nothing is read from them) and are checked against the main tensor if present.
  for (const auto& [l, order] : shared_copies ? mtp_blocks : std::map<int, int>()) {
    for (const auto& [param, suffix] : mtp_copies()) {
      auto it = shapes.find(param);
      MT_CHECK(it != shapes.end(), "MTP module {} shares {}, which the plan does not declare",
               block_name(l), param);
      ordered.push_back({{order, int(ordered.size())},
                         HfTensor{.hf_name = fmt::format("model.{}.{}", block_name(l), suffix),
                                  .param = param,
                                  .shape = it->second,
                                  .may_be_absent = true,
                                  .shared_copy = true}});
    }
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, t] : ordered) {
    by_hf_[t.hf_name] = tensors_.size();
    (t.shared_copy ? copies_ : by_param_)[t.param].push_back(tensors_.size());
    tensors_.push_back(std::move(t));
  }
}

std::vector<const HfTensor*> HfLayout::copies_of(const std::string& param) const {
  std::vector<const HfTensor*> out;
  if (auto it = copies_.find(param); it != copies_.end())
    for (size_t i : it->second) out.push_back(&tensors_[i]);
  return out;
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
