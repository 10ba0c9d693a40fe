// Where every Hugging Face tensor of a model lives in meshtrain's parameters (torchtitan's state
// dict adapters, as data): names, routed experts stacked [E, ...] in meshtrain and one tensor per
// expert in HF, and Llama's q/k rows, whose rotary pairs are interleaved in meshtrain (Meta's
// layout) and split into halves in HF. DeepSeek-V3's multi-token-prediction modules are blocks
// L..L+D-1 (L = n_layers) under the release's names. The rule: the map is a bijection of
// elements, row by row, so export then import is the identity; the MTP modules' copies of the
// shared embedding and head are written beside it and only checked on import.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/model/model.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

struct HfTensor {
  std::string hf_name;
  std::string param;           // meshtrain's name
  std::vector<int64_t> shape;  // HF shape
  int64_t expert = -1;         // >= 0: this tensor is param[expert] (shape drops dim 0)
  int64_t rope_heads = 0;      // > 0: rows are permuted within each of this many heads
  bool may_be_absent = false;  // e_score_correction_bias: DeepSeek-V2 releases have none (zeros)
  // An MTP module's copy of a shared weight (model.layers.N.embed_tokens.weight of
  // tok_embeddings.weight, model.layers.N.shared_head.head.weight of output.weight): written with
  // the same rows as the main tensor, never read into the parameter, checked equal when present.
  bool shared_copy = false;
};

// A meshtrain row: the last dim of a parameter at fixed leading indices. Its HF counterpart is one
// row of one HF tensor, the same columns.
struct HfRow {
  const HfTensor* tensor = nullptr;
  int64_t row = 0;  // row index in the HF tensor (0 for 1-D tensors)
};

class HfLayout {
 public:
  // Every HF tensor of the model's parameters and expert biases, in HF order (embedding, layers,
  // norm, head, then the MTP layers as the release orders them). InternalError for a parameter no
  // mapping rule covers. shared_copies = false leaves out the MTP modules' copies of the
  // embedding and head (a gradient file holds each parameter once).
  HfLayout(const Model& model, const std::vector<ParamInfo>& params, bool shared_copies = true);

  const std::vector<HfTensor>& tensors() const { return tensors_; }
  const HfTensor* find(const std::string& hf_name) const;
  // Parameters (and buffers) the layout covers; the others (token counters) are not exported.
  bool covers(const std::string& param) const { return by_param_.count(param) > 0; }
  // The HF row holding meshtrain row `row` of `param` at leading index `lead` (the expert of a
  // stacked weight, else 0).
  HfRow locate(const std::string& param, int64_t lead, int64_t row) const;
  const std::string& model_name() const { return model_name_; }
  // The shared copies of `param` (empty for every parameter but the embedding and the head).
  std::vector<const HfTensor*> copies_of(const std::string& param) const;
  // MTP modules among the parameters (blocks at index >= n_layers).
  int mtp_layers() const { return mtp_layers_; }

 private:
  std::string model_name_;
  std::vector<HfTensor> tensors_;
  std::map<std::string, size_t> by_hf_;
  std::map<std::string, std::vector<size_t>> by_param_;  // per expert (or one entry)
  std::map<std::string, std::vector<size_t>> copies_;    // shared copies per parameter
  int mtp_layers_ = 0;
};

// Calls f(local_row, hf_row, c0, c1) for every row of this rank's piece of p that lies inside the
// global tensor (FSDP padding rows are skipped): local_row indexes the rows of the local shard,
// [c0, c1) are the global columns it holds.
void for_each_piece_row(const HfLayout& layout, const ParamInfo& p,
                        const std::function<void(int64_t, const HfRow&, int64_t, int64_t)>& f);

// Llama's q/k row permutation for one head of `head_dim` rows: meshtrain row 2i + j (the j-th
// element of rotary pair i) is HF row j · head_dim/2 + i.
int64_t hf_row_of_meta_row(int64_t row, int64_t head_dim);

}  // namespace meshtrain
