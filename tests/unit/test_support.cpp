// Test helpers (see test_support.h).
#include "test_support.h"

#include <unistd.h>

#include <fstream>
#include <memory>

namespace meshtrain::testing {

Runtime& test_runtime() {
  static int argc = 1;
  static char name[] = "meshtrain_tests";
  static char* argv_storage[] = {name, nullptr};
  static char** argv = argv_storage;
  static std::unique_ptr<Runtime> rt = std::make_unique<Runtime>(&argc, &argv);
  return *rt;
}

JobConfig tiny_job(const std::vector<std::string>& overrides) {
  return tiny_job_config(
      {.steps = 4, .seed = 7, .warmup_steps = 2},
      {{"--training.local_batch_size", "2", "--metrics.log_freq", "1"}, overrides});
}

::testing::AssertionResult contains(const char* text_expr, const char* part_expr,
                                    const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text_expr << " does not contain " << part_expr
                                       << "\n  text:   " << text << "\n  wanted: " << part;
}

void TempDirTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = std::filesystem::temp_directory_path() /
         fmt::format("mt_{}_{}_{}", info->test_suite_name(), info->name(), getpid());
  std::filesystem::create_directories(dir_);
}

void TempDirTest::TearDown() { std::filesystem::remove_all(dir_); }

std::string TempDirTest::write(const std::string& name, const std::string& bytes) {
  std::filesystem::path p = dir_ / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

void expect_error(ErrorKind kind, const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace meshtrain::testing
