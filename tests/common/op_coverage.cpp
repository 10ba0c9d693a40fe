// Coverage declarations, the per-test verification and the two rules (see op_coverage.h).
#include "common/op_coverage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain::testing {

const char* check_name(Check kind) {
  return kind == Check::kGradcheck ? "float64 gradcheck" : "CPU-vs-CUDA case";
}

namespace {

struct Declaration {
  std::string file;
  std::vector<std::string> ops;
};
using Table = std::map<std::string, Declaration>;  // test -> what it declares

Table& table(Check kind) {
  static Table tables[2];
  return tables[int(kind)];
}

// The ops exercised so far by the declaring test that is running (one at a time).
struct Running {
  bool active = false;
  Check kind = Check::kGradcheck;
  std::set<std::string> seen;
};
Running& running() {
  static Running r;
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Stale entries: declarations of ops that are not registered, exemptions of ops that are not
// registered or that also have a check.
void stale_entries(const std::vector<OpFacts>& ops,
                   const std::map<std::string, std::vector<std::string>>& checks,
                   const Exemptions& exempt, Check kind, std::vector<std::string>& out) {
  std::set<std::string> names;
  for (const OpFacts& o : ops) names.insert(o.name);
  for (const auto& [op, tests] : checks)
    if (!names.count(op))
      out.push_back(fmt::format("{} declare{} a {} of op '{}', but no such op is registered",
                                join(tests), tests.size() == 1 ? "s" : "", check_name(kind), op));
  for (const auto& [op, why] : exempt) {
    if (!names.count(op))
      out.push_back(
          fmt::format("op '{}' is exempted ({}) but no such op is registered: remove the "
                      "exemption",
                      op, why));
    else if (checks.count(op))
      out.push_back(fmt::format("op '{}' has a {} ({}) and an exemption: remove the exemption", op,
                                check_name(kind), join(checks.at(op))));
  }
}

}  // namespace

bool declare_checks(Check kind, const std::string& test, const std::string& file,
                    const std::vector<std::string>& ops) {
  table(kind)[test] = {file, ops};
  return true;
}

void forget_checks(Check kind, const std::string& test) { table(kind).erase(test); }

std::map<std::string, std::vector<std::string>> declared_checks(Check kind) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [test, d] : table(kind))
    for (const std::string& op : d.ops) out[op].push_back(test);
  return out;
}

void note_checked(Check kind, const std::vector<std::string>& ops) {
  Running& r = running();
  if (!r.active || r.kind != kind) return;
  r.seen.insert(ops.begin(), ops.end());
}

CoverageScope::CoverageScope(Check kind, std::string test) : kind_(kind), test_(std::move(test)) {
  running() = {true, kind, {}};
}

CoverageScope::~CoverageScope() {
  Running& r = running();
  r.active = false;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const bool done = info && (info->result()->Failed() || info->result()->Skipped());
  if (done) return;
  const Declaration& d = table(kind_).at(test_);
  std::vector<std::string> missing;
  for (const std::string& op : d.ops)
    if (!r.seen.count(op)) missing.push_back(op);
  if (!missing.empty())
    ADD_FAILURE() << test_ << " (" << d.file << ") declares that its " << check_name(kind_)
                  << "s cover " << join(missing) << ", but none of its checks ran "
                  << (missing.size() == 1 ? "it" : "them")
                  << " (ops it did run: " << join({r.seen.begin(), r.seen.end()}) << ")";
}

std::vector<OpFacts> registered_ops() {
  const OpRegistry& reg = OpRegistry::instance();
  std::vector<OpFacts> out;
  for (const std::string& name : reg.op_names())
    out.push_back({.name = name,
                   .differentiable = bool(reg.op(name).backward),
                   .cuda_kernel = reg.has_kernel(name, DeviceType::kCUDA)});
  return out;
}

std::vector<std::string> gradcheck_gaps(
    const std::vector<OpFacts>& ops, const std::map<std::string, std::vector<std::string>>& checks,
    const Exemptions& exempt) {
  std::vector<std::string> out;
  for (const OpFacts& o : ops) {
    if (checks.count(o.name) || exempt.count(o.name)) continue;
    if (o.differentiable)
      out.push_back(
          fmt::format("op '{}' has a backward rule but no float64 gradcheck: add a test with "
                      "MT_GRADCHECK_TEST(Suite, Name, \"{}\") in tests/unit (or exempt it in "
                      "tests/unit/test_op_coverage.cpp, saying where its gradient is checked)",
                      o.name, o.name));
    else
      out.push_back(fmt::format(
          "op '{}' has no backward rule and is not declared non-differentiable: list it in "
          "tests/unit/test_op_coverage.cpp's exemptions with the reason it has no gradient (or "
          "give it a backward rule and a gradcheck)",
          o.name));
  }
  stale_entries(ops, checks, exempt, Check::kGradcheck, out);
  return out;
}

std::vector<std::string> cuda_gaps(const std::vector<OpFacts>& ops,
                                   const std::map<std::string, std::vector<std::string>>& checks,
                                   const Exemptions& exempt) {
  std::vector<std::string> out;
  for (const OpFacts& o : ops) {
    if (!o.cuda_kernel || checks.count(o.name) || exempt.count(o.name)) continue;
    out.push_back(
        fmt::format("op '{}' has a CUDA kernel but no CPU-vs-CUDA case: add a test with "
                    "MT_CUDA_CASE_TEST(Suite, Name, \"{}\") in tests/cuda (or exempt it in "
                    "tests/cuda/test_cuda_coverage.cpp, saying where it is checked)",
                    o.name, o.name));
  }
  stale_entries(ops, checks, exempt, Check::kCudaVsCpu, out);
  for (const OpFacts& o : ops)
    if (!o.cuda_kernel && exempt.count(o.name))
      out.push_back(
          fmt::format("op '{}' is exempted ({}) but has no CUDA kernel: remove the "
                      "exemption",
                      o.name, exempt.at(o.name)));
  return out;
}

}  // namespace meshtrain::testing
