// Shared helpers for tests that run the trainer in-process: one MPI runtime per test process
// and small job configs.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/tiny_job.h"
#include "meshtrain/core/check.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain::testing {

// The process's Runtime (MPI singleton mode when not under mpirun), created on first use.
Runtime& test_runtime();

// The tiny job (common/tiny_job.h) on the fortunes corpus with batch 2, 4 steps, seed 7, warmup 2,
// a log line every step. Extra overrides use the command-line syntax.
JobConfig tiny_job(const std::vector<std::string>& overrides = {});

// EXPECT_CONTAINS(text, part): the failure shows both strings.
::testing::AssertionResult contains(const char* text_expr, const char* part_expr,
                                    const std::string& text, const std::string& part);
#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::meshtrain::testing::contains, text, part)

// The message of the error of type E that `f` throws (fails the test when it throws nothing).
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// Runs `f`, which must throw a meshtrain::Error of `kind` whose message contains `needle`. Errors
// raised while a graph runs reach the caller as Error of the kernel's kind, so the kind is checked
// rather than the exception type.
void expect_error(ErrorKind kind, const std::function<void()>& f, const std::string& needle);

// A fixture with a fresh temporary folder per test, removed when the test ends.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Writes `bytes` to dir/name (creating sub-folders) and returns the path.
  std::string write(const std::string& name, const std::string& bytes);
  std::filesystem::path dir_;
};

}  // namespace meshtrain::testing
