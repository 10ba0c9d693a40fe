// Which ops the op-level tests check, declared next to the tests and verified while they run:
// a float64 gradient check per differentiable op (tests/unit) and a CPU-vs-CUDA case per op with a
// CUDA kernel (tests/cuda). The coverage tests walk the op registry against these declarations
// and name every op that has neither a check nor an entry in their exemption table. Rule: a
// declaration counts only if the declaring test's checks ran the op, or that test fails.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace meshtrain::testing {

enum class Check { kGradcheck, kCudaVsCpu };
const char* check_name(Check kind);

// Declares that test `test` ("Suite.Name", in `file`) checks `ops` (static initialisers of
// MT_GRADCHECK_TEST / MT_CUDA_CASE_TEST). Returns true.
bool declare_checks(Check kind, const std::string& test, const std::string& file,
                    const std::vector<std::string>& ops);
// Removes a test's declaration (tests of this machinery plant and remove their own).
void forget_checks(Check kind, const std::string& test);
// Every declared op -> the tests that declare it.
std::map<std::string, std::vector<std::string>> declared_checks(Check kind);

// The harnesses call this with the ops a finished check exercised (gradcheck: the ops between a
// differentiated input and a checked output; CPU-vs-CUDA: every live node of the compared GPU
// graph). Outside a declaring test it does nothing.
void note_checked(Check kind, const std::vector<std::string>& ops);

// Wraps the body of a declaring test: at the end, fails the test naming each declared op that
// none of its checks exercised (skipped when the test already failed or was skipped).
class CoverageScope {
 public:
  CoverageScope(Check kind, std::string test);
  ~CoverageScope();
  CoverageScope(const CoverageScope&) = delete;
  CoverageScope& operator=(const CoverageScope&) = delete;

 private:
  Check kind_;
  std::string test_;
};

// One registered op as the coverage rules see it.
struct OpFacts {
  std::string name;
  bool differentiable = false;  // has a backward rule
  bool cuda_kernel = false;     // has a kernel for DeviceType::kCUDA
};
std::vector<OpFacts> registered_ops();

// An op the rule does not ask a check of, and why (where it is covered instead).
using Exemptions = std::map<std::string, std::string>;

// The rules, as functions of plain data (so a test can plant an op). Each returns one line per
// problem, naming the op: empty means covered.
//   gradcheck: every differentiable op has a gradcheck declaration or an exemption; every
//     non-differentiable op has an exemption (saying why it has no gradient).
//   cuda: every op with a CUDA kernel has a CPU-vs-CUDA declaration or an exemption.
// Both: an exemption for an op that is not registered, or that also has a check, is stale.
std::vector<std::string> gradcheck_gaps(
    const std::vector<OpFacts>& ops, const std::map<std::string, std::vector<std::string>>& checks,
    const Exemptions& exempt);
std::vector<std::string> cuda_gaps(const std::vector<OpFacts>& ops,
                                   const std::map<std::string, std::vector<std::string>>& checks,
                                   const Exemptions& exempt);

}  // namespace meshtrain::testing

#define MT_COVERAGE_CAT_(a, b) a##b
#define MT_COVERAGE_CAT(a, b) MT_COVERAGE_CAT_(a, b)
// MT_DECLARE_CHECKS(kind, Suite, Name, "op", ...) at namespace scope and MT_COVERAGE_SCOPE(kind,
// Suite, Name) as the first statement of the test's body: for TEST_P, which the macros below do
// not wrap.
#define MT_DECLARE_CHECKS(kind, suite, name, ...)                                     \
  static const bool MT_COVERAGE_CAT(mt_covered_decl_, MT_COVERAGE_CAT(suite, name)) = \
      ::meshtrain::testing::declare_checks(kind, #suite "." #name, __FILE__, {__VA_ARGS__})
#define MT_COVERAGE_SCOPE(kind, suite, name) \
  ::meshtrain::testing::CoverageScope mt_coverage_scope(kind, #suite "." #name)
// MT_COVERING_TEST(kind, Suite, Name, "op", ...) { body }: a gtest TEST that declares the ops it
// checks; the body runs inside a CoverageScope.
#define MT_COVERING_TEST(kind, suite, name, ...)                                 \
  static void MT_COVERAGE_CAT(mt_covered_body_, MT_COVERAGE_CAT(suite, name))(); \
  MT_DECLARE_CHECKS(kind, suite, name, __VA_ARGS__);                             \
  TEST(suite, name) {                                                            \
    MT_COVERAGE_SCOPE(kind, suite, name);                                        \
    MT_COVERAGE_CAT(mt_covered_body_, MT_COVERAGE_CAT(suite, name))();           \
  }                                                                              \
  static void MT_COVERAGE_CAT(mt_covered_body_, MT_COVERAGE_CAT(suite, name))()
// A test whose float64 gradient checks (tests/unit/gradcheck.h) cover the listed ops.
#define MT_GRADCHECK_TEST(suite, name, ...) \
  MT_COVERING_TEST(::meshtrain::testing::Check::kGradcheck, suite, name, __VA_ARGS__)
// A test whose CPU-vs-CUDA cases (tests/cuda/op_harness.h) cover the listed ops.
#define MT_CUDA_CASE_TEST(suite, name, ...) \
  MT_COVERING_TEST(::meshtrain::testing::Check::kCudaVsCpu, suite, name, __VA_ARGS__)
