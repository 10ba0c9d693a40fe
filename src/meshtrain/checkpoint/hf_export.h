// Writing Hugging Face model folders: safetensors shards of at most max_shard_bytes, a
// model.safetensors.index.json and config.json. The layout of every file (header, offsets) is a
// function of the model alone, so the files are created once and then written in place, row by
// row, by whichever ranks own the rows: no rank needs another rank's piece.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/hf_mapping.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

struct HfShardPlan {
  FileDType dtype = FileDType::kF32;
  std::vector<std::string> files;    // "model-00001-of-00003.safetensors", ...
  std::vector<int> file_of;          // per layout tensor
  std::vector<int64_t> offset;       // per layout tensor: absolute byte offset of its data
  std::vector<std::string> headers;  // per file: the 8-byte length + JSON header
  std::vector<int64_t> file_bytes;   // per file
  int64_t total_bytes = 0;           // of tensor data (the index's total_size)
};

// Tensors in layout order, a new file when the next would pass max_shard_bytes.
HfShardPlan plan_hf_shards(const HfLayout& layout, FileDType dtype, int64_t max_shard_bytes);

// Creates every file of the plan in `folder` (header written, size set; data zero) — one process
// does this before any rank writes rows.
void create_hf_files(const HfShardPlan& plan, const std::string& folder);
// model.safetensors.index.json and config.json (written durably) — one process, after the rows.
void write_hf_index(const HfShardPlan& plan, const HfLayout& layout, const nlohmann::json& config,
                    const std::string& folder);

// The files of a plan opened for positional writes of rows in the export dtype.
class HfFileWriter {
 public:
  HfFileWriter(const HfShardPlan& plan, const HfLayout& layout, std::string folder);
  ~HfFileWriter();
  // Row `row`, columns [c0, c0 + n) of layout tensor `t`, given as `from` data (converted here).
  void write_row(const HfTensor& t, int64_t row, int64_t c0, int64_t n, DType from,
                 const void* data);
  void sync();  // fsync every file this writer wrote to
  int64_t bytes_written() const { return bytes_; }

 private:
  const HfShardPlan& plan_;
  const HfLayout& layout_;
  std::string folder_;
  std::vector<int> fds_;
  std::vector<bool> touched_;
  std::vector<std::byte> scratch_;
  int64_t bytes_ = 0;
};

// Writes every row of this rank's piece of parameter p (host tensor `local`, p.local_shape) that
// lies inside the global tensor (not FSDP padding).
void write_hf_piece(HfFileWriter& w, const HfLayout& layout, const ParamInfo& p,
                    const Tensor& local);

// Any reader of global meshtrain tensors (a checkpoint folder, host tensors): fills dst with the
// box [begin, begin + count) of `param` as `to`.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual void read_box(const std::string& param, const std::vector<int64_t>& begin,
                        const std::vector<int64_t>& count, DType to, void* dst) = 0;
};

struct HfProgress {
  int64_t tensors_done = 0, tensors = 0;
  int64_t bytes_done = 0, bytes = 0;
  const std::string* current = nullptr;
};

// Writes every tensor of the layout from `source`, streaming at most ~chunk_bytes of rows at a
// time (whole heads for permuted q/k), reading each as `read_as`.
void write_hf_from_source(HfFileWriter& w, const HfLayout& layout, TensorSource& source,
                          DType read_as, int64_t chunk_bytes = int64_t(64) << 20,
                          const std::function<void(const HfProgress&)>& progress = {});

}  // namespace meshtrain
