// Reading Hugging Face model folders: config.json plus model.safetensors.index.json and its
// shards, or one model.safetensors. The rule: a rank reads only the rows its own pieces need
// (ranged reads of the mapped files), converts them to the master dtype as it copies, and
// dequantises fp8 block-quantised weights (weight_scale_inv per block) on the way.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/checkpoint/hf_mapping.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

class HfFolder {
 public:
  // ConfigError/IoError naming the folder: no config.json, an unsupported architecture, a corrupt
  // index (a shard it names that is missing, a tensor not in the shard it names).
  explicit HfFolder(std::string path);
  ~HfFolder();

  const std::string& path() const { return path_; }
  const HfModelConfig& config() const { return config_; }

  struct Entry {
    const SafetensorsReader* file = nullptr;
    const SafetensorsEntry* tensor = nullptr;
    const SafetensorsReader* scale_file = nullptr;  // fp8: its weight_scale_inv
    const SafetensorsEntry* scale = nullptr;
  };
  // nullptr when the folder has no such tensor. With tie_word_embeddings, lm_head.weight is
  // model.embed_tokens.weight.
  const Entry* find(const std::string& hf_name) const;
  // Every tensor name of the folder (fp8 scales included).
  std::vector<std::string> names() const;

  // Checks the folder against a layout: every tensor present (but the ones that may be absent),
  // no tensor the model lacks (the MTP layers beyond num_hidden_layers excepted when the model
  // has none), shapes equal, dtypes convertible to `to`. The error names the tensor, both shapes
  // or the dtype.
  void check(const HfLayout& layout, DType to) const;

  // Row `row`, columns [c0, c1) of an HF tensor, as `to` (float32/float64) into dst.
  void read_row(const std::string& hf_name, const Entry& e, int64_t row, int64_t c0, int64_t c1,
                DType to, void* dst) const;
  // Bytes read from the folder's files so far.
  int64_t bytes_read() const;
  int files() const { return int(files_.size()); }

 private:
  std::string path_;
  HfModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Entry> entries_;
  mutable std::vector<std::byte> scratch_;
  mutable std::vector<float> scale_row_;
};

// Fills host tensor `dst` (p.local_shape, p.dtype) with this rank's piece of parameter p read from
// the folder; rows past the piece's limit (FSDP padding) are zero. A tensor the layout marks as
// possibly absent reads as zeros when the folder lacks it.
void read_hf_piece(const HfFolder& folder, const HfLayout& layout, const ParamInfo& p,
                   const Tensor& dst);

// The MTP layers' copies of a shared weight are not read into the model (meshtrain's MTP modules
// use the main embedding and head, as the release trained them): each copy present in the folder
// is read row by row beside the main tensor and must equal it after conversion to `to`.
// ValueError naming the copy, the row and column, and both values. `values` holds columns
// [c0, c1) of `row` of the main tensor.
void check_shared_copies(const HfFolder& folder, const std::vector<const HfTensor*>& copies,
                         const std::string& main_name, int64_t row, int64_t c0, int64_t c1,
                         DType to, const void* values);

// Dequantises one row of fp8 e4m3 values: dst[c] = e4m3(src[c]) * scale_row[(c0 + c) / block_cols]
// for c in [0, n), rounded once to `to` (the product is exact in double).
void dequantize_fp8_row(const uint8_t* src, int64_t n, int64_t c0, const float* scale_row,
                        int64_t block_cols, DType to, void* dst);

}  // namespace meshtrain
