// The safetensors file format: 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, offsets relative
// to the data region), then the data. The reader maps the file and validates the whole header
// before anything is read (entries tile the data region exactly: no overlap, no hole, nothing past
// the end); reads copy only the bytes asked for. The writer streams data with a running CRC-32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/file_io.h"

namespace meshtrain {

struct SafetensorsEntry {
  std::string name;
  FileDType dtype = FileDType::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // absolute byte range in the file (header included)
  int64_t numel() const;
  int64_t nbytes() const { return end - begin; }
};

// Largest header accepted (as the reference implementation: 100 MB).
constexpr int64_t kSafetensorsMaxHeader = 100'000'000;

class SafetensorsReader {
 public:
  // Opens and maps `path`, parses and validates the header: IoError naming the file (and the
  // tensor) for a missing or truncated file, bad JSON, an unknown dtype, a shape that does not
  // match its byte range, offsets out of range, overlapping or leaving holes, a header too large.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) = delete;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t file_size() const { return size_; }
  int64_t data_begin() const { return data_begin_; }  // 8 + header length
  // In the order of their data in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const;  // nullptr when absent
  const SafetensorsEntry& at(std::string_view name) const;    // IoError naming file and tensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies the whole tensor (dst_bytes must equal its size), or bytes [offset, offset + n) of
  // its data, into dst. Touches no other part of the file.
  void read(const SafetensorsEntry& e, void* dst, size_t dst_bytes) const;
  void read_range(const SafetensorsEntry& e, int64_t offset, int64_t n, void* dst) const;
  // The mapped bytes of a tensor (valid while the reader lives): zero-copy access.
  const std::byte* data(const SafetensorsEntry& e) const;
  // Bytes copied out by read/read_range so far (the "bytes this rank read" of a load).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  void parse_header();
  std::string path_;
  int64_t size_ = 0, data_begin_ = 0;
  const std::byte* map_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
  mutable int64_t bytes_read_ = 0;
};

struct SafetensorsWritten {
  int64_t bytes = 0;   // size of the file
  uint32_t crc32 = 0;  // of the whole file, header included
};

// Usage: add() every tensor, set metadata, then write() the data of the tensors in the order they
// were added (in chunks of any size), then finish(). The file is created new (never replaces one).
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  void add(const std::string& name, FileDType dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value);
  // Entries with their absolute byte ranges, once the header is fixed (after the first write()).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  int64_t data_bytes() const { return data_bytes_; }
  // The next bytes of the data region; the first call writes the header.
  void write(const void* data, size_t n);
  // Checks every declared byte was written, fsyncs and closes.
  SafetensorsWritten finish();
  const std::string& path() const { return path_; }

 private:
  void write_header();
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t, std::less<>> by_name_;
  int64_t data_bytes_ = 0, written_ = 0;
  std::unique_ptr<OutputFile> file_;
};

}  // namespace meshtrain
