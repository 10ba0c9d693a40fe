// Safetensors reader (mmap, header validated before any read) and writer (header first, data
// streamed, CRC-32 and fsync at the end). Every error names the file, and the tensor when one is
// at fault.
#include "meshtrain/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {
constexpr const char* kMetadataKey = "__metadata__";

std::string known_dtypes() { return "F64, F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL"; }

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t(1) << 62) / d) return -1;
    n *= d;
  }
  return n;
}

uint64_t read_le64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}
}  // namespace

int64_t SafetensorsEntry::numel() const { return checked_numel(shape); }

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK_T(IoError, fd >= 0, "cannot open {}: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    MT_THROW(IoError, "cannot stat {}: {}", path_, std::strerror(e));
  }
  size_ = int64_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    MT_CHECK_T(IoError, m != MAP_FAILED, "cannot map {}: {}", path_, std::strerror(e));
    map_ = static_cast<const std::byte*>(m);
  } else {
    ::close(fd);
  }
  try {
    parse_header();
  } catch (...) {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_t(size_));
    map_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_t(size_));
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      size_(o.size_),
      data_begin_(o.data_begin_),
      map_(o.map_),
      entries_(std::move(o.entries_)),
      by_name_(std::move(o.by_name_)),
      metadata_(std::move(o.metadata_)),
      bytes_read_(o.bytes_read_) {
  o.map_ = nullptr;
}

void SafetensorsReader::parse_header() {
  MT_CHECK_T(IoError, size_ >= 8,
             "{} is truncated: {} bytes, fewer than the 8-byte header length of a safetensors file",
             path_, size_);
  const uint64_t n = read_le64(reinterpret_cast<const unsigned char*>(map_));
  MT_CHECK_T(IoError, n <= uint64_t(kSafetensorsMaxHeader),
             "{}: the header length field says {} bytes, more than the {} byte limit (not a "
             "safetensors file, or a corrupted header)",
             path_, n, kSafetensorsMaxHeader);
  MT_CHECK_T(IoError, int64_t(n) <= size_ - 8,
             "{} is truncated: the header needs {} bytes after the length field, the file has {}",
             path_, n, size_ - 8);
  data_begin_ = 8 + int64_t(n);
  const char* text = reinterpret_cast<const char*>(map_) + 8;
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    MT_THROW(IoError, "{}: the header is not valid JSON ({})", path_, e.what());
  }
  MT_CHECK_T(IoError, h.is_object(), "{}: the header must be a JSON object, found {}", path_,
             h.type_name());
  const int64_t data_size = size_ - data_begin_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      MT_CHECK_T(IoError, v.is_object(), "{}: __metadata__ must be an object of strings", path_);
      for (auto m = v.begin(); m != v.end(); ++m) {
        MT_CHECK_T(IoError, m.value().is_string(),
                   "{}: __metadata__ value of \"{}\" must be a string, found {}", path_, m.key(),
                   m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      MT_THROW(IoError, "{}: tensor \"{}\": {}", path_, name, why);
    };
    if (!v.is_object()) bad("expected an object with dtype, shape and data_offsets");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing or non-string \"dtype\"");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing or non-array \"shape\"");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      bad("\"data_offsets\" must be an array [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    const std::optional<FileDType> fd = parse_file_dtype(dt);
    if (!fd) bad(fmt::format("unknown dtype \"{}\" (expected one of {})", dt, known_dtypes()));
    e.dtype = *fd;
    for (const nlohmann::json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad(fmt::format("shape {} must hold non-negative integers", v["shape"].dump()));
      e.shape.push_back(d.get<int64_t>());
    }
    for (const nlohmann::json& d : v["data_offsets"])
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad(fmt::format("data_offsets {} must be non-negative integers", v["data_offsets"].dump()));
    const int64_t b = v["data_offsets"][0].get<int64_t>(), en = v["data_offsets"][1].get<int64_t>();
    if (b > en) bad(fmt::format("data_offsets [{}, {}] end before they begin", b, en));
    if (en > data_size)
      bad(
          fmt::format("data_offsets [{}, {}] end past the data region of {} bytes (the file is "
                      "truncated or the header corrupted)",
                      b, en, data_size));
    const int64_t numel = e.numel();
    if (numel < 0) bad(fmt::format("shape {} is too large", v["shape"].dump()));
    if (numel * int64_t(file_dtype_size(e.dtype)) != en - b)
      bad(fmt::format("shape {} of {} needs {} bytes, data_offsets [{}, {}] hold {}",
                      v["shape"].dump(), dt, numel * int64_t(file_dtype_size(e.dtype)), b, en,
                      en - b));
    e.begin = data_begin_ + b;
    e.end = data_begin_ + en;
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t at = data_begin_;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const SafetensorsEntry& e = entries_[i];
    MT_CHECK_T(IoError, e.begin >= at,
               "{}: tensors \"{}\" and \"{}\" overlap (data bytes [{}, {}) and [{}, {}))", path_,
               entries_[i - 1].name, e.name, entries_[i - 1].begin - data_begin_, at - data_begin_,
               e.begin - data_begin_, e.end - data_begin_);
    MT_CHECK_T(IoError, e.begin == at,
               "{}: data bytes [{}, {}) belong to no tensor (before \"{}\"); the header is "
               "corrupted",
               path_, at - data_begin_, e.begin - data_begin_, e.name);
    at = e.end;
    by_name_[e.name] = i;
  }
  MT_CHECK_T(IoError, at == size_,
             "{}: the tensors end at data byte {}, the data region has {} bytes (extra bytes "
             "after the last tensor)",
             path_, at - data_begin_, data_size);
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsReader::at(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  MT_CHECK_T(IoError, e != nullptr, "{} holds no tensor \"{}\" ({} tensors)", path_, name,
             entries_.size());
  return *e;
}

const std::byte* SafetensorsReader::data(const SafetensorsEntry& e) const {
  MT_CHECK(e.begin >= data_begin_ && e.end <= size_, "{}: entry {} is not of this file", path_,
           e.name);
  return map_ + e.begin;
}

void SafetensorsReader::read(const SafetensorsEntry& e, void* dst, size_t dst_bytes) const {
  MT_CHECK_T(IoError, int64_t(dst_bytes) == e.nbytes(),
             "{}: tensor \"{}\" has {} bytes, the destination {}", path_, e.name, e.nbytes(),
             dst_bytes);
  read_range(e, 0, e.nbytes(), dst);
}

void SafetensorsReader::read_range(const SafetensorsEntry& e, int64_t offset, int64_t n,
                                   void* dst) const {
  MT_CHECK_T(IoError, offset >= 0 && n >= 0 && offset + n <= e.nbytes(),
             "{}: bytes [{}, {}) asked of tensor \"{}\", which has {}", path_, offset, offset + n,
             e.name, e.nbytes());
  if (n == 0) return;
  std::memcpy(dst, data(e) + offset, size_t(n));
  bytes_read_ += n;
}

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {}

void SafetensorsWriter::add(const std::string& name, FileDType dtype, std::vector<int64_t> shape) {
  MT_CHECK(!file_, "{}: add({}) after the data started", path_, name);
  MT_CHECK(name != kMetadataKey && !name.empty(), "{}: invalid tensor name \"{}\"", path_, name);
  MT_CHECK(by_name_.count(name) == 0, "{}: tensor {} added twice", path_, name);
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  const int64_t numel = e.numel();
  MT_CHECK(numel >= 0, "{}: tensor {} has a negative or too large shape", path_, name);
  e.begin = data_bytes_;
  e.end = data_bytes_ + numel * int64_t(file_dtype_size(dtype));
  data_bytes_ = e.end;
  by_name_[name] = entries_.size();
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  MT_CHECK(!file_, "{}: metadata set after the data started", path_);
  metadata_[key] = value;
}

void SafetensorsWriter::write_header() {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h[kMetadataKey] = std::move(m);
  }
  for (const SafetensorsEntry& e : entries_)
    h[e.name] = {{"dtype", file_dtype_name(e.dtype)},
                 {"shape", e.shape},
                 {"data_offsets", {e.begin, e.end}}};
  std::string text = h.dump();
  // Pad with spaces so the data region starts 8-byte aligned (as the reference writer does).
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  file_ = std::make_unique<OutputFile>(path_);
  file_->write(len, 8);
  file_->write(text.data(), text.size());
  const int64_t base = 8 + int64_t(text.size());
  for (SafetensorsEntry& e : entries_) e.begin += base, e.end += base;
}

void SafetensorsWriter::write(const void* data, size_t n) {
  if (!file_) write_header();
  MT_CHECK(written_ + int64_t(n) <= data_bytes_,
           "{}: {} more data bytes than the {} its tensors declare", path_,
           written_ + int64_t(n) - data_bytes_, data_bytes_);
  file_->write(data, n);
  written_ += int64_t(n);
}

SafetensorsWritten SafetensorsWriter::finish() {
  if (!file_) write_header();
  MT_CHECK(written_ == data_bytes_, "{}: {} data bytes written, its tensors declare {}", path_,
           written_, data_bytes_);
  file_->sync_and_close();
  return SafetensorsWritten{file_->bytes(), file_->crc32()};
}

}  // namespace meshtrain
