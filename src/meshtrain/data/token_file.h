// Pre-tokenized token files in llm.c's formats: a header of 256 int32 (magic, version, token
// count, the rest 0), then the tokens: magic 20240520 version 1 = uint16 tokens (GPT-2), magic
// 20240801 version 7 = uint32 tokens (Llama-3 and other vocabularies past 65,536). Readers check
// all three header fields against the file size before trusting a byte of it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace meshtrain {

inline constexpr int32_t kTokenFileMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int32_t kTokenFileMagicU32 = 20240801;  // uint32 tokens
inline constexpr int32_t kTokenFileVersionU32 = 7;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

enum class TokenWidth { kU16 = 2, kU32 = 4 };
// uint16 when every id below `vocab_size` fits, else uint32.
TokenWidth token_width_for(int64_t vocab_size);

// Writes a token file as it goes; close() puts the count in the header. The format holds at most
// 2^31 - 1 tokens per file (the count is int32).
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, TokenWidth width);  // IoError when it cannot open
  ~TokenFileWriter();  // a writer not closed leaves a file with a zero count and logs nothing
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // DataError for an id the width cannot store (naming it and its position in the file).
  void append(std::span<const int32_t> tokens);
  void close();  // IoError when writing fails
  int64_t num_tokens() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TokenWidth width_;
  std::FILE* f_ = nullptr;
  int64_t count_ = 0;
  std::vector<char> buf_;
};

// One file in one call (uint16 by default: DataError for ids past 65,535).
void write_token_file(const std::string& path, std::span<const int32_t> tokens,
                      TokenWidth width = TokenWidth::kU16);

// A read-only token file of either width: memory-mapped for the start-up scan (max_token, token),
// read with pread during the run so that a file truncated, unreadable (EIO) or replaced after it
// was opened is a DataError naming the file and the byte offset, never a SIGBUS or silent zeros.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // DataError naming the path on any problem
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  TokenWidth width() const { return width_; }
  int32_t token(int64_t i) const {
    return width_ == TokenWidth::kU16 ? int32_t(static_cast<const uint16_t*>(tokens_)[i])
                                      : int32_t(static_cast<const uint32_t*>(tokens_)[i]);
  }
  // Copies tokens [pos, pos + n) widened to int32, from the file as opened: DataError when the
  // path now names another file or a changed one (size, mtime), or the read fails or comes short.
  void read(int64_t pos, int64_t n, int32_t* out) const;
  // The largest id (a full scan); DataError for a uint32 id past 2^31 - 1. -1 when empty.
  int64_t max_token() const;
  const std::string& path() const { return path_; }

 private:
  void release();
  void check_unchanged(int64_t offset) const;
  std::string path_;
  int fd_ = -1;
  // Identity of the file when opened: device, inode, size, modification time (ns).
  uint64_t dev_ = 0, ino_ = 0;
  int64_t size_ = 0, mtime_ns_ = 0;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
  TokenWidth width_ = TokenWidth::kU16;
};

// `path` itself when it is a file, else the *.bin files directly in the folder, sorted.
std::vector<std::string> list_token_files(const std::string& path);

}  // namespace meshtrain
