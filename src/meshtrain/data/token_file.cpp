// Token file I/O: the writer emits exactly what llm.c's readers expect (either width); the reader
// mmaps and validates magic, version and size (so a truncated or foreign file never becomes
// tokens).
#include "meshtrain/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace fs = std::filesystem;

TokenWidth token_width_for(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenWidth::kU16 : TokenWidth::kU32;
}

namespace {

const char* width_name(TokenWidth w) { return w == TokenWidth::kU16 ? "uint16" : "uint32"; }

// DataError for the first id the width cannot store; `first` = position of tokens[0] in the file.
void check_fits(const std::string& path, TokenWidth w, std::span<const int32_t> tokens,
                int64_t first) {
  const int64_t max = w == TokenWidth::kU16 ? 65535 : INT32_MAX;
  for (size_t i = 0; i < tokens.size(); ++i)
    MT_CHECK_T(DataError, tokens[i] >= 0 && tokens[i] <= max,
               "token file '{}': version {} stores {} tokens, found token id {} at position {}{}",
               path, w == TokenWidth::kU16 ? kTokenFileVersion : kTokenFileVersionU32,
               width_name(w), tokens[i], first + int64_t(i),
               w == TokenWidth::kU16 && tokens[i] > max
                   ? " (ids past 65,535 need llm.c's uint32 format, version 7)"
                   : "");
}

}  // namespace

TokenFileWriter::TokenFileWriter(const std::string& path, TokenWidth width)
    : path_(path), width_(width) {
  f_ = std::fopen(path.c_str(), "wb");
  MT_CHECK_T(IoError, f_ != nullptr, "cannot open token file '{}' for writing: {}", path,
             std::strerror(errno));
  int32_t header[kTokenFileHeaderInts] = {};  // the count is written by close()
  MT_CHECK_T(IoError, std::fwrite(header, sizeof(header), 1, f_) == 1,
             "error while writing token file '{}': {}", path, std::strerror(errno));
}

TokenFileWriter::~TokenFileWriter() {
  if (f_) std::fclose(f_);
}

void TokenFileWriter::append(std::span<const int32_t> tokens) {
  MT_CHECK_T(IoError, f_ != nullptr, "token file '{}' is already closed", path_);
  check_fits(path_, width_, tokens, count_);
  // The count field is int32 in the format; larger data needs several files.
  MT_CHECK_T(DataError, count_ + int64_t(tokens.size()) <= int64_t(INT32_MAX),
             "token file '{}': at most {} tokens per file, found {}", path_, INT32_MAX,
             count_ + int64_t(tokens.size()));
  const size_t w = size_t(width_);
  buf_.resize(tokens.size() * w);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (width_ == TokenWidth::kU16) {
      const uint16_t v = uint16_t(tokens[i]);
      std::memcpy(buf_.data() + i * w, &v, w);
    } else {
      const uint32_t v = uint32_t(tokens[i]);
      std::memcpy(buf_.data() + i * w, &v, w);
    }
  }
  MT_CHECK_T(IoError, buf_.empty() || std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size(),
             "error while writing token file '{}': {}", path_, std::strerror(errno));
  count_ += int64_t(tokens.size());
}

void TokenFileWriter::close() {
  if (!f_) return;
  const int32_t header[3] = {width_ == TokenWidth::kU16 ? kTokenFileMagic : kTokenFileMagicU32,
                             width_ == TokenWidth::kU16 ? kTokenFileVersion : kTokenFileVersionU32,
                             int32_t(count_)};
  bool ok = std::fflush(f_) == 0 && std::fseek(f_, 0, SEEK_SET) == 0 &&
            std::fwrite(header, sizeof(header), 1, f_) == 1;
  ok = std::fclose(f_) == 0 && ok;
  f_ = nullptr;
  MT_CHECK_T(IoError, ok, "error while writing token file '{}': {}", path_, std::strerror(errno));
}

void write_token_file(const std::string& path, std::span<const int32_t> tokens, TokenWidth width) {
  check_fits(path, width, tokens, 0);  // before the file is created
  TokenFileWriter w(path, width);
  w.append(tokens);
  w.close();
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK_T(DataError, fd >= 0, "token file '{}' cannot be opened: {}", path,
             std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MT_THROW(DataError, "token file '{}' is not a regular file", path);
  }
  const int64_t size = st.st_size;
  if (size < kTokenFileHeaderBytes) {
    ::close(fd);
    MT_THROW(DataError, "token file '{}' has {} bytes, fewer than its {}-byte header", path, size,
             kTokenFileHeaderBytes);
  }
  void* m = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  fd_ = fd;  // kept for pread during the run
  dev_ = uint64_t(st.st_dev), ino_ = uint64_t(st.st_ino), size_ = size;
  mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    fd_ = -1;
    MT_THROW(DataError, "token file '{}' cannot be mapped: {}", path, std::strerror(e));
  }
  map_ = m, map_bytes_ = size_t(size);
  int32_t header[3];
  std::memcpy(header, map_, sizeof(header));
  if (header[0] != kTokenFileMagic && header[0] != kTokenFileMagicU32) {
    release();
    MT_THROW(DataError,
             "token file '{}': bad magic number, expected {} (uint16 tokens) or {} (uint32 "
             "tokens), found {} (not an llm.c token file?)",
             path, kTokenFileMagic, kTokenFileMagicU32, header[0]);
  }
  width_ = header[0] == kTokenFileMagic ? TokenWidth::kU16 : TokenWidth::kU32;
  const int32_t version = width_ == TokenWidth::kU16 ? kTokenFileVersion : kTokenFileVersionU32;
  if (header[1] != version) {
    release();
    MT_THROW(
        DataError,
        "token file '{}': unsupported version, expected {} ({} tokens) with magic {}, found {}",
        path, version, width_name(width_), header[0], header[1]);
  }
  const int64_t expected = kTokenFileHeaderBytes + int64_t(width_) * int64_t(header[2]);
  if (header[2] < 0 || expected != size) {
    release();
    MT_THROW(DataError,
             "token file '{}': header says {} tokens ({} bytes with the header), "
             "found a file of {} bytes: the data ends at byte offset {} (truncated or corrupted?)",
             path, header[2], expected, size, size);
  }
  num_tokens_ = header[2];
  tokens_ = static_cast<const char*>(map_) + kTokenFileHeaderBytes;
}

void TokenFile::check_unchanged(int64_t offset) const {
  struct stat now {
  }, open_file{};
  const bool path_ok = ::stat(path_.c_str(), &now) == 0;
  MT_CHECK_T(DataError, path_ok,
             "token file '{}' disappeared during the run ({}) before reading byte offset {}; "
             "restore it, or restart from the last checkpoint with the dataset fixed",
             path_, std::strerror(errno), offset);
  MT_CHECK_T(DataError, uint64_t(now.st_dev) == dev_ && uint64_t(now.st_ino) == ino_,
             "token file '{}' was replaced during the run (it names another file than the one "
             "opened at start-up) before reading byte offset {}; a run must see the same data "
             "throughout: restore it, or restart from the last checkpoint",
             path_, offset);
  MT_CHECK_T(DataError, ::fstat(fd_, &open_file) == 0, "token file '{}': fstat failed: {}", path_,
             std::strerror(errno));
  const int64_t mtime = int64_t(open_file.st_mtim.tv_sec) * 1000000000 + open_file.st_mtim.tv_nsec;
  MT_CHECK_T(DataError, int64_t(open_file.st_size) >= size_,
             "token file '{}' was truncated during the run to {} bytes (its header says {} "
             "tokens, {} bytes) before reading byte offset {}; restore it, or restart from the "
             "last checkpoint",
             path_, int64_t(open_file.st_size), num_tokens_, size_, offset);
  MT_CHECK_T(DataError, int64_t(open_file.st_size) == size_ && mtime == mtime_ns_,
             "token file '{}' was modified during the run ({} -> {} bytes) before reading byte "
             "offset {}; a run must see the same data throughout: restore it, or restart from "
             "the last checkpoint",
             path_, size_, int64_t(open_file.st_size), offset);
}

void TokenFile::read(int64_t pos, int64_t n, int32_t* out) const {
  if (n <= 0) return;
  const int64_t w = int64_t(width_);
  const int64_t offset = kTokenFileHeaderBytes + pos * w;
  MT_CHECK(pos >= 0 && pos + n <= num_tokens_, "token file '{}': read of [{}, {}) past {} tokens",
           path_, pos, pos + n, num_tokens_);
  check_unchanged(offset);
  // uint16 tokens land in the upper half of `out` and are widened front to back: element i is read
  // (bytes 2n + 2i) before out[i] (bytes 4i..4i+3) is written, and 4i + 4 <= 2n + 2(i + 1).
  char* dst = reinterpret_cast<char*>(out) + (width_ == TokenWidth::kU16 ? size_t(n) * 2 : 0);
  int64_t done = 0;
  while (done < n * w) {
    const ssize_t r = ::pread(fd_, dst + done, size_t(n * w - done), off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    MT_CHECK_T(DataError, r >= 0, "token file '{}' cannot be read at byte offset {}: {}", path_,
               offset + done, std::strerror(errno));
    MT_CHECK_T(DataError, r > 0,
               "token file '{}' ends at byte offset {}, but its header says {} tokens ({} bytes); "
               "it was truncated during the run",
               path_, offset + done, num_tokens_, kTokenFileHeaderBytes + num_tokens_ * w);
    done += r;
  }
  if (width_ == TokenWidth::kU16) {
    const uint16_t* t = reinterpret_cast<const uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(t[i]);
  }
}

int64_t TokenFile::max_token() const {
  int64_t m = -1;
  if (width_ == TokenWidth::kU16) {
    const uint16_t* t = static_cast<const uint16_t*>(tokens_);
    for (int64_t i = 0; i < num_tokens_; ++i) m = std::max<int64_t>(m, t[i]);
  } else {
    const uint32_t* t = static_cast<const uint32_t*>(tokens_);
    for (int64_t i = 0; i < num_tokens_; ++i) m = std::max<int64_t>(m, t[i]);
    MT_CHECK_T(DataError, m <= INT32_MAX, "token file '{}' holds token id {}, past 2^31 - 1", path_,
               m);
  }
  return m;
}

void TokenFile::release() {
  if (map_) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  map_ = nullptr, map_bytes_ = 0, tokens_ = nullptr, num_tokens_ = 0;
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      tokens_(o.tokens_),
      num_tokens_(o.num_tokens_),
      width_(o.width_) {
  fd_ = o.fd_, dev_ = o.dev_, ino_ = o.ino_, size_ = o.size_, mtime_ns_ = o.mtime_ns_;
  o.fd_ = -1;
  o.map_ = nullptr, o.map_bytes_ = 0, o.tokens_ = nullptr, o.num_tokens_ = 0;
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_), map_ = o.map_, map_bytes_ = o.map_bytes_, tokens_ = o.tokens_;
    num_tokens_ = o.num_tokens_, width_ = o.width_;
    fd_ = o.fd_, dev_ = o.dev_, ino_ = o.ino_, size_ = o.size_, mtime_ns_ = o.mtime_ns_;
    o.fd_ = -1;
    o.map_ = nullptr, o.map_bytes_ = 0, o.tokens_ = nullptr, o.num_tokens_ = 0;
  }
  return *this;
}

std::vector<std::string> list_token_files(const std::string& path) {
  MT_CHECK_T(DataError, !path.empty(),
             "tokens dataset needs [training] dataset_path: a .bin token file or a folder of them");
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  MT_CHECK_T(DataError, fs::is_directory(path, ec),
             "tokens dataset: '{}' not found (expected a .bin token file or a folder of them)",
             path);
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path))
    if (e.is_regular_file() && e.path().extension() == ".bin") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  MT_CHECK_T(DataError, !files.empty(), "tokens dataset: no *.bin files in folder '{}'", path);
  return files;
}

}  // namespace meshtrain
