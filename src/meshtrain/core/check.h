// One family of error macros for all of meshtrain. Host errors throw a typed exception whose
// message says what was expected, what was found, where (file:line) and on which rank.
// Library code never exits; `main` catches meshtrain::Error, prints one line, returns non-zero.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace meshtrain {

enum class ErrorKind { kInternal, kConfig, kShape, kValue, kIo, kComm, kCuda, kData };
const char* error_kind_name(ErrorKind kind);

// The rank that error messages name; set once by the bootstrap (-1 before it runs).
void set_error_rank(int rank);
int error_rank();

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, const char* file, int line);
  ErrorKind kind() const { return kind_; }
  // The message without location: what a user reads in the one-line report.
  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::string location_;
};

class ConfigError : public Error {
 public:
  ConfigError(std::string m, const char* f, int l)
      : Error(ErrorKind::kConfig, std::move(m), f, l) {}
};
class ShapeError : public Error {
 public:
  ShapeError(std::string m, const char* f, int l) : Error(ErrorKind::kShape, std::move(m), f, l) {}
};
class ValueError : public Error {
 public:
  ValueError(std::string m, const char* f, int l) : Error(ErrorKind::kValue, std::move(m), f, l) {}
};
class IoError : public Error {
 public:
  IoError(std::string m, const char* f, int l) : Error(ErrorKind::kIo, std::move(m), f, l) {}
};
class CommError : public Error {
 public:
  CommError(std::string m, const char* f, int l) : Error(ErrorKind::kComm, std::move(m), f, l) {}
};
class CudaError : public Error {
 public:
  CudaError(std::string m, const char* f, int l) : Error(ErrorKind::kCuda, std::move(m), f, l) {}
};
class DataError : public Error {
 public:
  DataError(std::string m, const char* f, int l) : Error(ErrorKind::kData, std::move(m), f, l) {}
};
class InternalError : public Error {
 public:
  InternalError(std::string m, const char* f, int l)
      : Error(ErrorKind::kInternal, std::move(m), f, l) {}
};

}  // namespace meshtrain

// MT_THROW(ConfigError, "key {} expects an integer, found {}", key, found)
#define MT_THROW(Type, ...) throw ::meshtrain::Type(fmt::format(__VA_ARGS__), __FILE__, __LINE__)

// MT_CHECK(cond, "expected ..., found ...", args...): an invariant of meshtrain itself; throws
// InternalError, whose message names the failed condition. MT_CHECK_T(Type, cond, ...): an error a
// user can cause (config, shapes, data, I/O); throws Type (ConfigError, ShapeError, ...) with the
// message alone.
#define MT_CHECK(cond, ...)                                                                \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      throw ::meshtrain::InternalError(                                                    \
          fmt::format("check '{}' failed: {}", #cond, fmt::format(__VA_ARGS__)), __FILE__, \
          __LINE__);                                                                       \
  } while (0)

#define MT_CHECK_T(Type, cond, ...)                                          \
  do {                                                                       \
    if (!(cond)) [[unlikely]]                                                \
      throw ::meshtrain::Type(fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// Equality check that prints both sides: MT_CHECK_EQ(a.size(), b.size(), "matmul inner dim").
#define MT_CHECK_EQ(a, b, what)                                                             \
  do {                                                                                      \
    const auto& mt_a_ = (a);                                                                \
    const auto& mt_b_ = (b);                                                                \
    if (!(mt_a_ == mt_b_)) [[unlikely]]                                                     \
      throw ::meshtrain::ShapeError(                                                        \
          fmt::format("{}: expected {} == {}, found {} vs {}", what, #a, #b, mt_a_, mt_b_), \
          __FILE__, __LINE__);                                                              \
  } while (0)
