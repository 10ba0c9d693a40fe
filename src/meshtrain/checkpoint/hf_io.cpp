// HfFolder: the weight map of an HF folder over mapped safetensors files, its checks against a
// layout, and row reads (with fp8 dequantisation) that fill one rank's parameter pieces.
#include "meshtrain/checkpoint/hf_io.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kScaleSuffix = "_scale_inv";

bool ends_with(const std::string& s, const char* t) {
  const size_t n = std::strlen(t);
  return s.size() >= n && s.compare(s.size() - n, n, t) == 0;
}
std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}
}  // namespace

HfFolder::HfFolder(std::string path) : path_(std::move(path)) {
  MT_CHECK_T(IoError, fs::is_directory(path_), "HF folder '{}' does not exist", path_);
  config_ = read_hf_config(path_);
  const fs::path index = fs::path(path_) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file
  if (fs::exists(index)) {
    json j = json::parse(read_text_file(index.string()), nullptr, false);
    MT_CHECK_T(IoError,
               !j.is_discarded() && j.is_object() && j.contains("weight_map") &&
                   j["weight_map"].is_object(),
               "{}: not a safetensors index (JSON with a weight_map object)", index.string());
    for (const auto& [name, file] : j["weight_map"].items()) {
      MT_CHECK_T(IoError, file.is_string(), "{}: weight_map[{}] must be a file name, found {}",
                 index.string(), name, file.dump());
      weight_map[name] = file.get<std::string>();
    }
  } else {
    const fs::path single = fs::path(path_) / "model.safetensors";
    MT_CHECK_T(IoError, fs::exists(single),
               "HF folder '{}' has neither model.safetensors.index.json nor model.safetensors",
               path_);
    SafetensorsReader r(single.string());
    for (const SafetensorsEntry& e : r.entries()) weight_map[e.name] = "model.safetensors";
  }
  std::map<std::string, size_t> file_index;
  for (const auto& [name, file] : weight_map) {
    if (!file_index.count(file)) {
      const fs::path f = fs::path(path_) / file;
      MT_CHECK_T(IoError, fs::exists(f), "{}: the index names shard {} (for {}), which is missing",
                 path_, file, name);
      file_index[file] = files_.size();
      files_.push_back(std::make_unique<SafetensorsReader>(f.string()));
    }
    const SafetensorsReader& r = *files_[file_index[file]];
    const SafetensorsEntry* e = r.find(name);
    MT_CHECK_T(IoError, e != nullptr, "{}: the index puts {} in {}, which does not hold it", path_,
               name, file);
    entries_[name] = Entry{&r, e, nullptr, nullptr};
  }
  for (auto& [name, e] : entries_) {
    auto s = entries_.find(name + kScaleSuffix);
    if (s != entries_.end()) e.scale_file = s->second.file, e.scale = s->second.tensor;
  }
}

HfFolder::~HfFolder() = default;

const HfFolder::Entry* HfFolder::find(const std::string& hf_name) const {
  auto it = entries_.find(hf_name);
  if (it == entries_.end() && hf_name == "lm_head.weight" && config_.tie_word_embeddings)
    it = entries_.find("model.embed_tokens.weight");
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> HfFolder::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : entries_) out.push_back(n);
  return out;
}

int64_t HfFolder::bytes_read() const {
  int64_t b = 0;
  for (const auto& f : files_) b += f->bytes_read();
  return b;
}

void HfFolder::check(const HfLayout& layout, DType to) const {
  for (const HfTensor& t : layout.tensors()) {
    const Entry* e = find(t.hf_name);
    if (!e) {
      MT_CHECK_T(ValueError, t.may_be_absent, "HF folder {}: tensor {} (meshtrain's {}) is missing",
                 path_, t.hf_name, t.param);
      continue;
    }
    const SafetensorsEntry& s = *e->tensor;
    MT_CHECK_T(ValueError, s.shape == t.shape,
               "HF folder {}: tensor {} has shape {}, meshtrain's {} needs {}", path_, t.hf_name,
               shape_str(s.shape), t.param, shape_str(t.shape));
    if (s.dtype == FileDType::kF8E4M3) {
      MT_CHECK_T(ValueError, e->scale != nullptr,
                 "HF folder {}: tensor {} is F8_E4M3 but {}{} is missing", path_, t.hf_name,
                 t.hf_name, kScaleSuffix);
      const int64_t br = config_.fp8_block_rows, bc = config_.fp8_block_cols;
      MT_CHECK_T(ValueError, br > 0 && s.shape.size() == 2,
                 "HF folder {}: tensor {} is F8_E4M3, which needs a 2-D weight and a "
                 "quantization_config weight_block_size in config.json",
                 path_, t.hf_name);
      const std::vector<int64_t> want{(s.shape[0] + br - 1) / br, (s.shape[1] + bc - 1) / bc};
      MT_CHECK_T(ValueError,
                 e->scale->shape == want && is_floating(e->scale->dtype) &&
                     e->scale->dtype != FileDType::kF8E4M3,
                 "HF folder {}: {}{} must be a float {} (one scale per {}x{} block), found {} {}",
                 path_, t.hf_name, kScaleSuffix, shape_str(want), br, bc,
                 file_dtype_name(e->scale->dtype), shape_str(e->scale->shape));
    } else {
      MT_CHECK_T(
          ValueError, can_convert_from_file(s.dtype, to),
          "HF folder {}: tensor {} has dtype {}, which cannot be converted to meshtrain's {}",
          path_, t.hf_name, file_dtype_name(s.dtype), dtype_name(to));
    }
  }
  // Tensors the model has no place for. A model without MTP modules skips the folder's MTP
  // layers (num_nextn_predict_layers after the last layer), as HF's own loader does; the config
  // check says so. A model with them has a place for every tensor of those layers.
  static const std::regex layer_re(R"(^model\.layers\.(\d+)\.)");
  const int64_t layers = config_.num_layers();
  const bool skip_mtp = layout.mtp_layers() == 0;
  for (const auto& [name, e] : entries_) {
    if (layout.find(name)) continue;
    if (ends_with(name, kScaleSuffix) && layout.find(name.substr(0, name.size() - 10))) continue;
    if (ends_with(name, "rotary_emb.inv_freq")) continue;  // old llama files store the rope table
    std::smatch m;
    if (skip_mtp && config_.mtp_layers > 0 && std::regex_search(name, m, layer_re) &&
        std::stoll(m[1]) >= layers && std::stoll(m[1]) < layers + config_.mtp_layers)
      continue;
    MT_THROW(ValueError, "HF folder {}: tensor {} has no counterpart in meshtrain's {} model",
             path_, name, layout.model_name());
  }
}

void check_shared_copies(const HfFolder& folder, const std::vector<const HfTensor*>& copies,
                         const std::string& main_name, int64_t row, int64_t c0, int64_t c1,
                         DType to, const void* values) {
  if (copies.empty()) return;
  const size_t es = dtype_size(to);
  std::vector<std::byte> got(size_t(c1 - c0) * es);
  for (const HfTensor* c : copies) {
    const HfFolder::Entry* e = folder.find(c->hf_name);
    if (!e) continue;  // absent copies are fine: nothing is read from them
    folder.read_row(c->hf_name, *e, row, c0, c1, to, got.data());
    if (std::memcmp(got.data(), values, got.size()) == 0) continue;
    int64_t col = 0;
    while (std::memcmp(got.data() + size_t(col) * es,
                       static_cast<const char*>(values) + size_t(col) * es, es) == 0)
      ++col;
    auto at = [&](const void* p) {
      return to == DType::kF64 ? static_cast<const double*>(p)[col]
                               : double(static_cast<const float*>(p)[col]);
    };
    MT_THROW(ValueError,
             "HF folder {}: {} differs from {} at row {} column {} ({} vs {}): meshtrain's MTP "
             "modules share the main model's weight, so the folder's copy must equal it (fix or "
             "drop the copy; it is not read)",
             folder.path(), c->hf_name, main_name, row, c0 + col, at(got.data()), at(values));
  }
}

void dequantize_fp8_row(const uint8_t* src, int64_t n, int64_t c0, const float* scale_row,
                        int64_t block_cols, DType to, void* dst) {
  for (int64_t c = 0; c < n; ++c) {
    const double v = double(e4m3_to_float(src[c])) * double(scale_row[(c0 + c) / block_cols]);
    if (to == DType::kF64)
      static_cast<double*>(dst)[c] = v;
    else if (to == DType::kF32)
      static_cast<float*>(dst)[c] = float(v);
    else
      MT_THROW(ValueError, "fp8 weights dequantise to float32 or float64, not {}", dtype_name(to));
  }
}

void HfFolder::read_row(const std::string& hf_name, const Entry& e, int64_t row, int64_t c0,
                        int64_t c1, DType to, void* dst) const {
  const SafetensorsEntry& s = *e.tensor;
  const int64_t cols = s.shape.empty() ? 1 : s.shape.back();
  const int64_t n = c1 - c0;
  const size_t esize = file_dtype_size(s.dtype);
  scratch_.resize(size_t(n) * esize);
  e.file->read_range(s, (row * cols + c0) * int64_t(esize), n * int64_t(esize), scratch_.data());
  if (s.dtype != FileDType::kF8E4M3) {
    convert_from_file(s.dtype, scratch_.data(), to, dst, n, hf_name);
    return;
  }
  // One row of the block scales: [ceil(cols / bc)] values for block row `row / br`.
  const SafetensorsEntry& sc = *e.scale;
  const int64_t scols = sc.shape[1], srow = row / config_.fp8_block_rows;
  const size_t ss = file_dtype_size(sc.dtype);
  std::vector<std::byte> raw(size_t(scols) * ss);
  e.scale_file->read_range(sc, srow * scols * int64_t(ss), scols * int64_t(ss), raw.data());
  scale_row_.resize(size_t(scols));
  convert_from_file(sc.dtype, raw.data(), DType::kF32, scale_row_.data(), scols, hf_name);
  dequantize_fp8_row(reinterpret_cast<const uint8_t*>(scratch_.data()), n, c0, scale_row_.data(),
                     config_.fp8_block_cols, to, dst);
}

void read_hf_piece(const HfFolder& folder, const HfLayout& layout, const ParamInfo& p,
                   const Tensor& dst) {
  MT_CHECK(dst.shape() == p.local_shape && dst.dtype() == p.dtype,
           "{}: host buffer {} {} for piece {} {}", p.name, dst.shape(), dst.dtype(), p.local_shape,
           p.dtype);
  std::memset(dst.raw(), 0, dst.nbytes());
  const size_t row_bytes = size_t(p.local_shape.last()) * dtype_size(p.dtype);
  const std::vector<const HfTensor*> copies = layout.copies_of(p.name);
  for_each_piece_row(layout, p, [&](int64_t r, const HfRow& at, int64_t c0, int64_t c1) {
    const HfFolder::Entry* e = folder.find(at.tensor->hf_name);
    if (!e) {
      MT_CHECK_T(ValueError, at.tensor->may_be_absent, "HF folder {}: tensor {} is missing",
                 folder.path(), at.tensor->hf_name);
      return;  // zeros
    }
    char* row = static_cast<char*>(dst.raw()) + size_t(r) * row_bytes;
    folder.read_row(at.tensor->hf_name, *e, at.row, c0, c1, p.dtype, row);
    check_shared_copies(folder, copies, at.tensor->hf_name, at.row, c0, c1, p.dtype, row);
  });
}

}  // namespace meshtrain
