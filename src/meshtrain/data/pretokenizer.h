// The pre-tokenizer of a tokenizer.json: Split (a PCRE2 regex in UTF + UCP mode, JIT-compiled
// where the library can, or a literal string) with Hugging Face's delimiter behaviours, Digits and
// ByteLevel (GPT-2's split when use_regex, the prefix space). Pieces are byte ranges of the input;
// invalid UTF-8 never matches a pattern, so its bytes end up in pieces of their own.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain {

// A compiled PCRE2 pattern. DataError quoting the pattern, PCRE2's message and the offset when
// PCRE2 rejects it; `where` names the file and key for that message.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of every non-overlapping match, leftmost first; after an
  // empty match the search resumes one character later.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

// How a Split step treats the pieces its pattern matches (Hugging Face's
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // From the tokenizer.json "pre_tokenizer" value (null: the whole text is one piece). DataError
  // naming `file` for an unsupported type or option. The steps must end in ByteLevel.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& file);

  // Calls emit(piece) for every piece, in order. Thread-safe.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;

  bool byte_level() const { return byte_level_; }
  bool all_jit() const;
  std::string describe() const;  // "Split(regex, Isolated) + ByteLevel"

 private:
  struct Step {
    std::string kind;              // "Split", "Digits", "ByteLevel"
    std::shared_ptr<Regex> regex;  // Split with a regex; Digits; ByteLevel with use_regex
    std::string literal;           // Split with {"String": ...}
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
  };
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  static void add_steps(const nlohmann::json& j, const std::string& file, std::vector<Step>& steps);
  // Splits text[r] by one step, appending the resulting ranges (offsets into `text`).
  static void split_range(const Step& s, std::string_view text, std::pair<size_t, size_t> r,
                          Ranges& out);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace meshtrain
