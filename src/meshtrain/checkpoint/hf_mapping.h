// Where every Hugging Face tensor of a model lives in meshtrain's parameters (torchtitan's state
// dict adapters, as data): names, routed experts stacked [E, ...] in meshtrain and one tensor per
// expert in HF, and Llama's q/k rows, whose rotary pairs are interleaved in meshtrain (Meta's
// layout) and split into halves in HF. The rule: the map is a bijection of elements, row by row,
// so export then import is the identity.
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
  // norm, head). InternalError for a parameter no mapping rule covers.
  HfLayout(const Model& model, const std::vector<ParamInfo>& params);

  const std::vector<HfTensor>& tensors() const { return tensors_; }
  const HfTensor* find(const std::string& hf_name) const;
  // Parameters (and buffers) the layout covers; the others (token counters) are not exported.
  bool covers(const std::string& param) const { return by_param_.count(param) > 0; }
  // The HF row holding meshtrain row `row` of `param` at leading index `lead` (the expert of a
  // stacked weight, else 0).
  HfRow locate(const std::string& param, int64_t lead, int64_t row) const;
  const std::string& model_name() const { return model_name_; }

 private:
  std::string model_name_;
  std::vector<HfTensor> tensors_;
  std::map<std::string, size_t> by_hf_;
  std::map<std::string, std::vector<size_t>> by_param_;  // per expert (or one entry)
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
