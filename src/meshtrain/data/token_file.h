// Pre-tokenized token files in llm.c's format: a header of 256 int32 (magic 20240520,
// version 1 = uint16 tokens, header[2] = token count, the rest 0), then the tokens. Readers
// check all three header fields against the file size before trusting a byte of it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshtrain {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// Writes `tokens` (each in [0, 65535], else DataError) to `path`; IoError if writing fails.
void write_token_file(const std::string& path, std::span<const int32_t> tokens);

// A read-only, memory-mapped token file.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // DataError naming the path on any problem
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::span<const uint16_t> tokens() const { return {tokens_, size_t(num_tokens_)}; }
  int64_t num_tokens() const { return num_tokens_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
};

// `path` itself when it is a file, else the *.bin files directly in the folder, sorted.
std::vector<std::string> list_token_files(const std::string& path);

}  // namespace meshtrain
