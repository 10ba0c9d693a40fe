// Internal to core/config: the one coercion path shared by TOML values, command-line
// overrides and schema defaults, and the "did you mean" suggestions. Not a public API.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/config.h"

namespace toml {
inline namespace v3 {
class node;
}
}  // namespace toml

namespace meshtrain::config_detail {

// A value as the user wrote it, before it meets its key's spec.
struct Raw {
  enum Kind { kInt, kFloat, kBool, kString, kOther } kind = kOther;
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s;  // kString text, or the TOML type name for kOther ("array", "table")
  std::optional<std::vector<std::string>> strings;  // kOther from a TOML array of strings
  std::string where;  // " (x.toml line 3)" or " (from --training.steps)"
};

// "in [1, 10]" / "one of a, b" style fragments of error messages.
std::string range_text(const KeySpec& spec);
std::string sentinel_text(const KeySpec& spec);
std::optional<bool> parse_bool_text(std::string_view text);

// Checks `raw` against the key's type, range, sentinels and choices; throws the ConfigError a
// user reads.
ConfigValue coerce(const KeySpec& spec, const Raw& raw);
Raw raw_from_value(const ConfigValue& v, std::string where);
Raw raw_from_text(const KeySpec& spec, const std::string& text, std::string where);
Raw raw_from_toml(const toml::node& node, std::string where);
std::string unknown_key_message(const Schema& schema, std::string_view section,
                                std::string_view name);
std::string unknown_section_message(const Schema& schema, std::string_view section);

}  // namespace meshtrain::config_detail
