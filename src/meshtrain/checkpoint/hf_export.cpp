// HF export: the shard plan (headers as the safetensors writer formats them), file creation and
// positional row writes (pwrite), and the two ways rows arrive: a rank's own parameter pieces, or
// a streaming source for offline conversion.
#include "meshtrain/checkpoint/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

size_t tensor_index(const HfLayout& layout, const HfTensor& t) {
  return size_t(&t - layout.tensors().data());
}

}  // namespace

HfShardPlan plan_hf_shards(const HfLayout& layout, FileDType dtype, int64_t max_shard_bytes) {
  MT_CHECK_T(ValueError, can_convert_to_file(DType::kF32, dtype),
             "HF export dtype {} is not a float dtype meshtrain writes", file_dtype_name(dtype));
  HfShardPlan plan;
  plan.dtype = dtype;
  const auto& ts = layout.tensors();
  const int64_t es = int64_t(file_dtype_size(dtype));
  std::vector<std::vector<size_t>> groups(1);
  int64_t in_file = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t b = numel_of(ts[i].shape) * es;
    if (!groups.back().empty() && in_file + b > max_shard_bytes) groups.emplace_back(), in_file = 0;
    groups.back().push_back(i);
    in_file += b;
  }
  plan.file_of.resize(ts.size());
  plan.offset.resize(ts.size());
  const size_t n = groups.size();
  for (size_t f = 0; f < n; ++f) {
    plan.files.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, n));
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["__metadata__"] = {{"format", "pt"}};
    int64_t at = 0;
    for (size_t i : groups[f]) {
      const int64_t b = numel_of(ts[i].shape) * es;
      h[ts[i].hf_name] = {{"dtype", file_dtype_name(dtype)},
                          {"shape", ts[i].shape},
                          {"data_offsets", {at, at + b}}};
      plan.file_of[i] = int(f);
      plan.offset[i] = at;
      at += b;
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned, as safetensors writes
    std::string header(8, '\0');
    for (int k = 0; k < 8; ++k) header[size_t(k)] = char(uint64_t(text.size()) >> (8 * k));
    header += text;
    for (size_t i : groups[f]) plan.offset[i] += int64_t(header.size());
    plan.file_bytes.push_back(int64_t(header.size()) + at);
    plan.headers.push_back(std::move(header));
    plan.total_bytes += at;
  }
  return plan;
}

void create_hf_files(const HfShardPlan& plan, const std::string& folder) {
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const std::string path = (fs::path(folder) / plan.files[f]).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    MT_CHECK_T(IoError, fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
    const std::string& h = plan.headers[f];
    const bool ok = ::pwrite(fd, h.data(), h.size(), 0) == ssize_t(h.size()) &&
                    ::ftruncate(fd, plan.file_bytes[f]) == 0;
    const int e = errno;
    ::close(fd);
    MT_CHECK_T(IoError, ok, "cannot write the header of {}: {}", path, std::strerror(e));
  }
}

void write_hf_index(const HfShardPlan& plan, const HfLayout& layout, const nlohmann::json& config,
                    const std::string& folder) {
  nlohmann::ordered_json idx;
  idx["metadata"] = {{"total_size", plan.total_bytes}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < layout.tensors().size(); ++i)
    map[layout.tensors()[i].hf_name] = plan.files[size_t(plan.file_of[i])];
  idx["weight_map"] = std::move(map);
  write_file_durably((fs::path(folder) / "model.safetensors.index.json").string(),
                     idx.dump(2) + "\n");
  write_file_durably((fs::path(folder) / "config.json").string(), config.dump(2) + "\n");
}

HfFileWriter::HfFileWriter(const HfShardPlan& plan, const HfLayout& layout, std::string folder)
    : plan_(plan), layout_(layout), folder_(std::move(folder)) {
  for (const std::string& f : plan.files) {
    const std::string path = (fs::path(folder_) / f).string();
    const int fd = ::open(path.c_str(), O_WRONLY);
    MT_CHECK_T(IoError, fd >= 0, "cannot open {} for writing: {}", path, std::strerror(errno));
    fds_.push_back(fd);
  }
  touched_.assign(fds_.size(), false);
}

HfFileWriter::~HfFileWriter() {
  for (int fd : fds_) ::close(fd);
}

void HfFileWriter::write_row(const HfTensor& t, int64_t row, int64_t c0, int64_t n, DType from,
                             const void* data) {
  const size_t i = tensor_index(layout_, t);
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  MT_CHECK(
      c0 >= 0 && c0 + n <= cols && row >= 0 && row * cols < std::max<int64_t>(numel_of(t.shape), 1),
      "{}: row {} columns [{}, {}) outside {}", t.hf_name, row, c0, c0 + n, t.shape);
  const size_t es = file_dtype_size(plan_.dtype);
  scratch_.resize(size_t(n) * es);
  convert_to_file(from, data, plan_.dtype, scratch_.data(), n, t.hf_name);
  const int f = plan_.file_of[i];
  const int64_t at = plan_.offset[i] + (row * cols + c0) * int64_t(es);
  size_t done = 0;
  while (done < scratch_.size()) {
    const ssize_t k = ::pwrite(fds_[size_t(f)], scratch_.data() + done, scratch_.size() - done,
                               off_t(at + int64_t(done)));
    MT_CHECK_T(IoError, k > 0, "cannot write {} of {}: {}", t.hf_name, plan_.files[size_t(f)],
               std::strerror(errno));
    done += size_t(k);
  }
  touched_[size_t(f)] = true;
  bytes_ += int64_t(done);
}

void HfFileWriter::sync() {
  for (size_t f = 0; f < fds_.size(); ++f)
    MT_CHECK_T(IoError, !touched_[f] || ::fsync(fds_[f]) == 0, "cannot sync {}: {}", plan_.files[f],
               std::strerror(errno));
}

void write_hf_piece(HfFileWriter& w, const HfLayout& layout, const ParamInfo& p,
                    const Tensor& local) {
  MT_CHECK(local.shape() == p.local_shape, "{}: host piece {} for local shape {}", p.name,
           local.shape(), p.local_shape);
  const size_t row_bytes = size_t(p.local_shape.last()) * dtype_size(local.dtype());
  // The MTP layers' copies of the embedding and head get the same rows (their rows are the main
  // tensor's: neither is permuted nor stacked).
  const std::vector<const HfTensor*> copies = layout.copies_of(p.name);
  for_each_piece_row(layout, p, [&](int64_t r, const HfRow& at, int64_t c0, int64_t c1) {
    const char* row = static_cast<const char*>(local.raw()) + size_t(r) * row_bytes;
    w.write_row(*at.tensor, at.row, c0, c1 - c0, local.dtype(), row);
    for (const HfTensor* c : copies) w.write_row(*c, at.row, c0, c1 - c0, local.dtype(), row);
  });
}

void write_hf_from_source(HfFileWriter& w, const HfLayout& layout, TensorSource& source,
                          DType read_as, int64_t chunk_bytes,
                          const std::function<void(const HfProgress&)>& progress) {
  HfProgress pr;
  pr.tensors = int64_t(layout.tensors().size());
  for (const HfTensor& t : layout.tensors()) pr.bytes += numel_of(t.shape);
  const size_t es = dtype_size(read_as);
  pr.bytes *= int64_t(es);
  std::vector<std::byte> buf;
  for (const HfTensor& t : layout.tensors()) {
    const int64_t rows = t.shape.size() < 2 ? 1 : t.shape[0];
    const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
    // Whole heads per chunk for permuted q/k, so a chunk's HF rows are its meshtrain rows.
    const int64_t unit = t.rope_heads > 0 ? rows / t.rope_heads : 1;
    int64_t step = std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, cols * int64_t(es)));
    step = std::max(unit, step / unit * unit);
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t n = std::min(step, rows - r0);
      buf.resize(size_t(n * cols) * es);
      std::vector<int64_t> begin, count;
      if (t.expert >= 0)
        begin = {t.expert, r0, 0}, count = {1, n, cols};
      else if (t.shape.size() == 2)
        begin = {r0, 0}, count = {n, cols};
      else
        begin = {0}, count = {cols};
      source.read_box(t.param, begin, count, read_as, buf.data());
      for (int64_t r = 0; r < n; ++r) {
        // A shared copy is written where it is, not where its parameter maps.
        const HfRow at = t.shared_copy
                             ? HfRow{&t, r0 + r}
                             : layout.locate(t.param, std::max<int64_t>(t.expert, 0), r0 + r);
        w.write_row(*at.tensor, at.row, 0, cols, read_as, buf.data() + size_t(r * cols) * es);
      }
      pr.bytes_done += n * cols * int64_t(es);
      if (progress) progress(pr);
    }
    ++pr.tensors_done;
    pr.current = &t.hf_name;
    if (progress) progress(pr);
  }
}

}  // namespace meshtrain
