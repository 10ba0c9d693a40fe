// Token file I/O: the writer emits exactly what llm.c's readers expect; the reader mmaps and
// validates magic, version and size (so a truncated or foreign file never becomes tokens).
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

void write_token_file(const std::string& path, std::span<const int32_t> tokens) {
  std::vector<uint16_t> body(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    MT_CHECK_T(DataError, tokens[i] >= 0 && tokens[i] <= 65535,
               "token file '{}': version {} stores uint16 tokens, found token id {} at position {}",
               path, kTokenFileVersion, tokens[i], i);
    body[i] = uint16_t(tokens[i]);
  }
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  // The count field is int32 in the format; larger files need to be split.
  MT_CHECK_T(DataError, tokens.size() <= size_t(INT32_MAX),
             "token file '{}': at most {} tokens per file, found {}", path, INT32_MAX,
             tokens.size());
  header[2] = int32_t(tokens.size());
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  MT_CHECK_T(IoError, f != nullptr, "cannot open token file '{}' for writing: {}", path,
             std::strerror(errno));
  bool ok = std::fwrite(header, sizeof(header), 1, f.get()) == 1;
  if (!body.empty()) ok = ok && std::fwrite(body.data(), 2, body.size(), f.get()) == body.size();
  ok = std::fflush(f.get()) == 0 && ok;
  MT_CHECK_T(IoError, ok, "error while writing token file '{}': {}", path, std::strerror(errno));
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
  ::close(fd);  // the mapping keeps the file alive
  MT_CHECK_T(DataError, m != MAP_FAILED, "token file '{}' cannot be mapped: {}", path,
             std::strerror(errno));
  map_ = m, map_bytes_ = size_t(size);
  int32_t header[3];
  std::memcpy(header, map_, sizeof(header));
  if (header[0] != kTokenFileMagic) {
    release();
    MT_THROW(DataError,
             "token file '{}': bad magic number, expected {}, found {} (not an llm.c "
             "token file?)",
             path, kTokenFileMagic, header[0]);
  }
  if (header[1] != kTokenFileVersion) {
    release();
    MT_THROW(DataError,
             "token file '{}': unsupported version, expected {} (uint16 tokens), found {}", path,
             kTokenFileVersion, header[1]);
  }
  const int64_t expected = kTokenFileHeaderBytes + 2 * int64_t(header[2]);
  if (header[2] < 0 || expected != size) {
    release();
    MT_THROW(DataError,
             "token file '{}': header says {} tokens ({} bytes with the header), "
             "found a file of {} bytes (truncated or corrupted?)",
             path, header[2], expected, size);
  }
  num_tokens_ = header[2];
  tokens_ =
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kTokenFileHeaderBytes);
}

void TokenFile::release() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr, map_bytes_ = 0, tokens_ = nullptr, num_tokens_ = 0;
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      tokens_(o.tokens_),
      num_tokens_(o.num_tokens_) {
  o.map_ = nullptr, o.map_bytes_ = 0, o.tokens_ = nullptr, o.num_tokens_ = 0;
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_), map_ = o.map_, map_bytes_ = o.map_bytes_, tokens_ = o.tokens_;
    num_tokens_ = o.num_tokens_;
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
