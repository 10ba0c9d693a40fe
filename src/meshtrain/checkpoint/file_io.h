// Durable file output for checkpoints. Every byte goes through OutputFile::write (so a test can
// make the N-th write of a process fail with ENOSPC or SIGKILL the process mid-write), a file
// counts only after fsync, a folder after its own fsync, and a rename never replaces a path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

// Fault injection for tests: MESHTRAIN_CHECKPOINT_FAULT = "enospc@N", "eio@N" or "kill@N",
// optionally followed by ":rank=R". The N-th OutputFile::write call of the process (on rank R, or
// any rank) writes half its bytes, then fails with ENOSPC ("enospc") or EIO ("eio"), or raises
// SIGKILL ("kill").
struct WriteFault {
  enum class Kind : uint8_t { kNone, kNoSpace, kIoError, kKill };
  Kind kind = Kind::kNone;
  int64_t at_write = 0;  // 1-based
  int rank = -1;         // -1: every rank
};
WriteFault parse_write_fault(std::string_view spec);  // ConfigError on a malformed spec
// Installs `fault` for this process when its rank matches `this_rank` (else clears it), and
// restarts the write count. The trainer installs the environment's value at start-up.
void set_write_fault(const WriteFault& fault, int this_rank);
void install_write_fault_from_env(int this_rank);

// A new file (never an existing one: O_EXCL), written front to back with a running CRC-32.
class OutputFile {
 public:
  explicit OutputFile(std::string path);
  ~OutputFile();  // closes without syncing if sync_and_close was not reached (an error path)
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);  // all n bytes, or IoError naming the file
  void sync_and_close();                   // fsync then close; IoError naming the file
  int64_t bytes() const { return bytes_; }
  uint32_t crc32() const { return crc_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// zlib's CRC-32 (the checksum checkpoint indexes record), over a buffer or a whole file.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
uint32_t file_crc32(const std::string& path, int64_t* size = nullptr);
std::string crc32_hex(uint32_t crc);  // "0x1a2b3c4d"

void sync_directory(const std::string& path);
// rename(2) that fails (IoError) instead of replacing an existing `to`.
void rename_no_replace(const std::string& from, const std::string& to);
// A small file written whole, fsynced (JSON manifests and indexes).
void write_file_durably(const std::string& path, std::string_view contents);
std::string read_text_file(const std::string& path);  // IoError naming the file

}  // namespace meshtrain
