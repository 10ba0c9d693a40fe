// Pre-tokenizer steps over byte ranges. Each step applies its pattern to every piece on its own
// (a look-ahead never sees past a piece), as Hugging Face tokenizers does; empty pieces are
// dropped. PCRE2 match data and range buffers are per thread, so split() is const and
// thread-safe.
#include "meshtrain/data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;

// GPT-2's split, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One match context per thread, with a JIT stack big enough for long runs of one class.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

SplitBehavior parse_behavior(const std::string& s, const std::string& file) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  MT_THROW(DataError,
           "{}: pre_tokenizer Split behavior \"{}\" is unknown: expected Removed, Isolated, "
           "MergedWithPrevious, MergedWithNext or Contiguous",
           file, s);
}

const char* behavior_name(SplitBehavior b) {
  switch (b) {
    case SplitBehavior::kRemoved: return "Removed";
    case SplitBehavior::kIsolated: return "Isolated";
    case SplitBehavior::kMergedWithPrevious: return "MergedWithPrevious";
    case SplitBehavior::kMergedWithNext: return "MergedWithNext";
    case SplitBehavior::kContiguous: return "Contiguous";
  }
  return "?";
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  MT_CHECK_T(DataError, code_ != nullptr, "{}: PCRE2 rejects the regex \"{}\": {} at offset {}",
             where, pattern, pcre2_message(err), offset);
  jit_ = pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local MatchScratch scratch;
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  while (start < n) {
    int rc = jit_ ? pcre2_jit_match(code, subject, n, start, 0, scratch.data, scratch.context)
                  : pcre2_match(code, subject, n, start, 0, scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MT_CHECK_T(DataError, rc >= 0, "regex \"{}\" failed on a piece of {} bytes: {}", pattern_, n,
               pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    if (ov[1] > ov[0]) {
      out.emplace_back(size_t(ov[0]), size_t(ov[1]));
      start = size_t(ov[1]);
    } else {  // an empty match: resume at the next character
      start = size_t(ov[0]) + 1;
      while (start < n && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

void PreTokenizer::add_steps(const json& j, const std::string& file, std::vector<Step>& steps) {
  MT_CHECK_T(DataError, j.is_object() && j.contains("type") && j["type"].is_string(),
             "{}: a pre_tokenizer must be an object with a \"type\", found {}", file, j.dump());
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    MT_CHECK_T(DataError, j.contains("pretokenizers") && j["pretokenizers"].is_array(),
               "{}: pre_tokenizer Sequence needs a \"pretokenizers\" array", file);
    for (const json& s : j["pretokenizers"]) add_steps(s, file, steps);
    return;
  }
  Step s;
  s.kind = type;
  if (type == "Split") {
    const json& p = j.value("pattern", json::object());
    if (p.contains("Regex") && p["Regex"].is_string()) {
      s.regex = std::make_shared<Regex>(p["Regex"].get<std::string>(),
                                        file + ": pre_tokenizer Split pattern");
    } else if (p.contains("String") && p["String"].is_string() &&
               !p["String"].get<std::string>().empty()) {
      s.literal = p["String"].get<std::string>();
    } else {
      MT_THROW(DataError,
               "{}: pre_tokenizer Split needs \"pattern\": {{\"Regex\": ...}} or {{\"String\": "
               "...}} (non-empty), found {}",
               file, p.dump());
    }
    s.behavior = parse_behavior(j.value("behavior", std::string("Isolated")), file);
    s.invert = j.value("invert", false);
  } else if (type == "Digits") {
    // Rust's char::is_numeric is the Unicode N categories: each one alone, or runs of them.
    s.regex = std::make_shared<Regex>(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+",
                                      file + ": pre_tokenizer Digits");
  } else if (type == "ByteLevel") {
    // Hugging Face's defaults when a key is missing: add_prefix_space and use_regex are true.
    s.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, "ByteLevel");
  } else {
    MT_THROW(DataError,
             "{}: pre_tokenizer type \"{}\" is not supported (supported: Sequence, Split, Digits, "
             "ByteLevel)",
             file, type);
  }
  steps.push_back(std::move(s));
}

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& file) {
  PreTokenizer p;
  if (!j.is_null()) add_steps(j, file, p.steps_);
  for (size_t i = 0; i + 1 < p.steps_.size(); ++i)
    MT_CHECK_T(DataError, p.steps_[i].kind != "ByteLevel",
               "{}: pre_tokenizer step {} after ByteLevel is not supported (ByteLevel must be "
               "the last step)",
               file, p.steps_[i + 1].kind);
  p.byte_level_ = !p.steps_.empty() && p.steps_.back().kind == "ByteLevel";
  MT_CHECK_T(DataError, p.byte_level_,
             "{}: only byte-level BPE is supported: the pre_tokenizer must end with a ByteLevel "
             "step, found {}",
             file, j.is_null() ? std::string("null") : p.describe());
  return p;
}

void PreTokenizer::split_range(const Step& s, std::string_view text, std::pair<size_t, size_t> r,
                               Ranges& out) {
  thread_local Ranges found;
  thread_local std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
  const std::string_view piece = text.substr(r.first, r.second - r.first);
  found.clear();
  if (s.regex) {
    s.regex->find_all(piece, found);
  } else {
    for (size_t at = piece.find(s.literal); at != std::string_view::npos;
         at = piece.find(s.literal, at + s.literal.size()))
      found.emplace_back(at, at + s.literal.size());
  }
  // Every byte of the piece, as matched and unmatched runs in order.
  parts.clear();
  size_t prev = 0;
  for (auto [b, e] : found) {
    if (b > prev) parts.push_back({{prev, b}, s.invert});
    parts.push_back({{b, e}, !s.invert});
    prev = e;
  }
  if (prev < piece.size()) parts.push_back({{prev, piece.size()}, s.invert});
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.emplace_back(r.first + b, r.first + e);
  };
  switch (s.behavior) {
    case SplitBehavior::kRemoved:
      for (auto& [rg, m] : parts)
        if (!m) emit(rg.first, rg.second);
      break;
    case SplitBehavior::kIsolated:
      for (auto& [rg, m] : parts) emit(rg.first, rg.second);
      break;
    case SplitBehavior::kMergedWithPrevious:
    case SplitBehavior::kContiguous: {
      // MergedWithPrevious: a match joins the piece before it (unless that was a match too);
      // Contiguous: runs of the same kind join.
      const bool contiguous = s.behavior == SplitBehavior::kContiguous;
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (auto& [rg, m] : parts) {
        bool join = contiguous ? (m == prev_match) : (m && !prev_match);
        if (join && !acc.empty())
          acc.back().second = rg.second;
        else
          acc.push_back(rg);
        prev_match = m;
      }
      for (auto [b, e] : acc) emit(b, e);
      break;
    }
    case SplitBehavior::kMergedWithNext: {  // a match joins the piece after it
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (size_t i = parts.size(); i-- > 0;) {
        auto [rg, m] = parts[i];
        if (m && !prev_match && !acc.empty())
          acc.back().first = rg.first;
        else
          acc.push_back(rg);
        prev_match = m;
      }
      for (size_t i = acc.size(); i-- > 0;) emit(acc[i].first, acc[i].second);
      break;
    }
  }
}

void PreTokenizer::split(std::string_view text,
                         const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return;
  thread_local Ranges a, b, sub;
  thread_local std::string prefixed;
  a.assign(1, {0, text.size()});
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    b.clear();
    for (auto r : a) split_range(steps_[i], text, r, b);
    std::swap(a, b);
  }
  const Step& last = steps_.back();  // ByteLevel (from_json checks)
  for (auto [lo, hi] : a) {
    std::string_view piece = text.substr(lo, hi - lo);
    if (last.add_prefix_space && piece.front() != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (!last.regex) {
      emit(piece);
      continue;
    }
    sub.clear();
    split_range(last, piece, {0, piece.size()}, sub);
    for (auto [sb, se] : sub) emit(piece.substr(sb, se - sb));
  }
}

bool PreTokenizer::all_jit() const {
  for (const Step& s : steps_)
    if (s.regex && !s.regex->jit()) return false;
  return true;
}

std::string PreTokenizer::describe() const {
  std::string d;
  for (const Step& s : steps_) {
    if (!d.empty()) d += " + ";
    if (s.kind == "Split")
      d += fmt::format("Split({}, {}{})", s.regex ? "regex" : "string", behavior_name(s.behavior),
                       s.invert ? ", inverted" : "");
    else if (s.kind == "ByteLevel")
      d += fmt::format("ByteLevel({}{})", s.regex ? "GPT-2 split" : "no split",
                       s.add_prefix_space ? ", prefix space" : "");
    else
      d += s.kind;
  }
  return d.empty() ? "none" : d;
}

}  // namespace meshtrain
