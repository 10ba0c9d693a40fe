// POSIX file output with fsync, CRC-32 (zlib) and the write-fault hook; renames without replace.
// Faults are counted per process over every OutputFile::write call, on any thread.
#include "meshtrain/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {
WriteFault g_fault;
std::atomic<int64_t> g_write_calls{0};

std::string errno_text(int e) { return std::strerror(e); }
}  // namespace

WriteFault parse_write_fault(std::string_view spec) {
  WriteFault f;
  if (spec.empty()) return f;
  auto bad = [&] {
    MT_THROW(ConfigError,
             "MESHTRAIN_CHECKPOINT_FAULT must be \"enospc@N\", \"eio@N\" or \"kill@N\" (N >= 1), "
             "optionally followed by \":rank=R\"; found \"{}\"",
             spec);
  };
  const size_t at = spec.find('@');
  if (at == std::string_view::npos) bad();
  const std::string_view kind = spec.substr(0, at);
  if (kind == "enospc")
    f.kind = WriteFault::Kind::kNoSpace;
  else if (kind == "eio")
    f.kind = WriteFault::Kind::kIoError;
  else if (kind == "kill")
    f.kind = WriteFault::Kind::kKill;
  else
    bad();
  std::string rest(spec.substr(at + 1));
  std::string rank_part;
  if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    rank_part = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (rank_part.rfind("rank=", 0) != 0) bad();
    rank_part = rank_part.substr(5);
  }
  auto number = [&](const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) bad();
    return std::stoll(s);
  };
  f.at_write = number(rest);
  if (f.at_write < 1) bad();
  if (!rank_part.empty()) f.rank = int(number(rank_part));
  return f;
}

void set_write_fault(const WriteFault& fault, int this_rank) {
  g_fault = (fault.rank < 0 || fault.rank == this_rank) ? fault : WriteFault{};
  g_write_calls = 0;
}

void install_write_fault_from_env(int this_rank) {
  const char* spec = std::getenv("MESHTRAIN_CHECKPOINT_FAULT");
  set_write_fault(parse_write_fault(spec ? spec : ""), this_rank);
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  MT_CHECK_T(IoError, fd_ >= 0, "cannot create {}: {}", path_, errno_text(errno));
  crc_ = uint32_t(::crc32(0L, Z_NULL, 0));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t n) {
  MT_CHECK(fd_ >= 0, "{} is already closed", path_);
  const char* p = static_cast<const char*>(data);
  const size_t kChunk = size_t(64) << 20;
  while (n > 0) {
    size_t want = std::min(n, kChunk);
    const int64_t call = ++g_write_calls;
    const bool fault = g_fault.kind != WriteFault::Kind::kNone && call == g_fault.at_write;
    if (fault) want = std::max<size_t>(want / 2, 1);  // the faulty call gets half its bytes out
    ssize_t w = ::write(fd_, p, want);
    if (w < 0 && errno == EINTR) continue;
    int err = w < 0 ? errno : 0;
    if (w > 0) {
      crc_ = uint32_t(::crc32(crc_, reinterpret_cast<const Bytef*>(p), uInt(w)));
      p += w, n -= size_t(w), bytes_ += w;
    }
    if (fault) {
      if (g_fault.kind == WriteFault::Kind::kKill) {
        std::fprintf(stderr, "meshtrain: MESHTRAIN_CHECKPOINT_FAULT kill@%lld: SIGKILL in %s\n",
                     static_cast<long long>(call), path_.c_str());
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      err = g_fault.kind == WriteFault::Kind::kIoError ? EIO : ENOSPC;
    }
    if (w == 0 && err == 0) err = EIO;
    MT_CHECK_T(IoError, err == 0, "cannot write {}: {} ({} bytes written)", path_, errno_text(err),
               bytes_);
  }
}

void OutputFile::sync_and_close() {
  MT_CHECK(fd_ >= 0, "{} is already closed", path_);
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    MT_THROW(IoError, "cannot sync {}: {}", path_, errno_text(e));
  }
  MT_CHECK_T(IoError, ::close(fd) == 0, "cannot close {}: {}", path_, errno_text(errno));
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt k = uInt(std::min<size_t>(n, size_t(1) << 30));
    crc = uint32_t(::crc32(crc, p, k));
    p += k, n -= k;
  }
  return crc;
}

uint32_t file_crc32(const std::string& path, int64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK_T(IoError, fd >= 0, "cannot open {}: {}", path, errno_text(errno));
  std::vector<char> buf(size_t(8) << 20);
  uint32_t crc = uint32_t(::crc32(0L, Z_NULL, 0));
  int64_t total = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      MT_THROW(IoError, "cannot read {}: {}", path, errno_text(e));
    }
    if (r == 0) break;
    crc = crc32_update(crc, buf.data(), size_t(r));
    total += r;
  }
  ::close(fd);
  if (size) *size = total;
  return crc;
}

std::string crc32_hex(uint32_t crc) { return fmt::format("0x{:08x}", crc); }

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MT_CHECK_T(IoError, fd >= 0, "cannot open folder {}: {}", path, errno_text(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  MT_CHECK_T(IoError, rc == 0, "cannot sync folder {}: {}", path, errno_text(e));
}

void rename_no_replace(const std::string& from, const std::string& to) {
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && errno == EINVAL) {
    // A filesystem without RENAME_NOREPLACE: check, then rename (not atomic against another
    // writer of the same folder; one job writes a checkpoint folder).
    errno = EEXIST;
    rc = ::access(to.c_str(), F_OK) == 0 ? -1 : ::rename(from.c_str(), to.c_str());
  }
  if (rc == 0) return;
  const int e = errno;
  if (e == EEXIST || e == ENOTEMPTY)
    MT_THROW(IoError,
             "cannot rename {} to {}: {} already exists (an existing checkpoint is never replaced)",
             from, to, to);
  MT_THROW(IoError, "cannot rename {} to {}: {}", from, to, errno_text(e));
}

void write_file_durably(const std::string& path, std::string_view contents) {
  OutputFile f(path);
  f.write(contents.data(), contents.size());
  f.sync_and_close();
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK_T(IoError, bool(in), "cannot open {}: {}", path, errno_text(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  MT_CHECK_T(IoError, !in.bad(), "cannot read {}", path);
  return ss.str();
}

}  // namespace meshtrain
