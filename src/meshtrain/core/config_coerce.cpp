// Config value coercion (file, override and default values meet their key's spec in one place)
// and the edit-distance suggestions for unknown keys and sections.
#include "meshtrain/core/config_coerce.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace config_detail {

std::string format_bound(double b, KeyType type) {
  return type == KeyType::kInt ? fmt::format("{}", int64_t(b)) : fmt::format("{}", b);
}

std::string range_text(const KeySpec& s) {
  if (s.min && s.max)
    return fmt::format("in [{}, {}]", format_bound(*s.min, s.type), format_bound(*s.max, s.type));
  if (s.min) return fmt::format(">= {}", format_bound(*s.min, s.type));
  if (s.max) return fmt::format("<= {}", format_bound(*s.max, s.type));
  return "";
}

std::string sentinel_text(const KeySpec& s) {
  if (!s.sentinel) return "";
  const ConfigValue& v = *s.sentinel;
  std::string shown = std::holds_alternative<double>(v) ? fmt::format("{}", std::get<double>(v))
                                                        : config_value_to_string(v);
  return fmt::format(" (or {} = {})", shown, s.sentinel_meaning);
}

// ---- one coercion path for file and command-line values --------------------------------------

std::string describe(const Raw& r) {
  switch (r.kind) {
    case Raw::kInt: return fmt::format("integer {}", r.i);
    case Raw::kFloat: return fmt::format("float {}", config_value_to_string(r.d));
    case Raw::kBool: return fmt::format("boolean {}", r.b ? "true" : "false");
    case Raw::kString: return fmt::format("string {}", config_value_to_string(r.s));
    case Raw::kOther: return r.s;
  }
  return "a value";
}

[[noreturn]] void type_error(const KeySpec& s, const Raw& r) {
  if (s.type == KeyType::kChoice)
    MT_THROW(ConfigError, "{} must be {}, found {}{}", s.full_name(), s.accepted(), describe(r),
             r.where);
  const std::string what = s.type == KeyType::kInt     ? "an integer"
                           : s.type == KeyType::kFloat ? "a number"
                                                       : s.accepted();
  MT_THROW(ConfigError, "{} expects {}, found {}{}", s.full_name(), what, describe(r), r.where);
}

void check_range(const KeySpec& s, double v, const std::string& shown, const std::string& where) {
  if ((s.min && v < *s.min) || (s.max && v > *s.max))
    MT_THROW(ConfigError, "{} must be {}{}, found {}{}", s.full_name(), range_text(s),
             sentinel_text(s), shown, where);
}

// Sentinels are numbers; an integer sentinel also matches its float spelling (-1 vs -1.0).
bool is_sentinel(const KeySpec& s, double v) {
  if (!s.sentinel) return false;
  if (auto* i = std::get_if<int64_t>(&*s.sentinel)) return double(*i) == v;
  if (auto* d = std::get_if<double>(&*s.sentinel)) return *d == v;
  return false;
}

ConfigValue coerce(const KeySpec& s, const Raw& r) {
  switch (s.type) {
    case KeyType::kInt: {
      if (r.kind != Raw::kInt) type_error(s, r);
      if (!is_sentinel(s, double(r.i)))
        check_range(s, double(r.i), fmt::format("{}", r.i), r.where);
      return r.i;
    }
    case KeyType::kFloat: {
      // Integers are accepted for float keys: `lr = 1` means 1.0.
      if (r.kind != Raw::kInt && r.kind != Raw::kFloat) type_error(s, r);
      const double d = r.kind == Raw::kInt ? double(r.i) : r.d;
      if (!std::isfinite(d))
        MT_THROW(ConfigError, "{} expects a finite number, found {}{}", s.full_name(),
                 config_value_to_string(d), r.where);
      if (!is_sentinel(s, d)) check_range(s, d, fmt::format("{}", d), r.where);
      return d;
    }
    case KeyType::kBool:
      if (r.kind != Raw::kBool) type_error(s, r);
      return r.b;
    case KeyType::kString: {
      std::string text;
      if (r.kind == Raw::kString)
        text = r.s;
      else if (r.kind == Raw::kInt && s.int_as_string)
        text = fmt::format("{}", r.i);
      else if (r.strings && s.list_as_string)
        text = fmt::format("{}", fmt::join(*r.strings, ","));
      else
        type_error(s, r);
      if (s.validate) {
        std::string expected = s.validate(text);
        if (!expected.empty())
          MT_THROW(ConfigError, "{} must be {}, found {}{}", s.full_name(), expected,
                   config_value_to_string(text), r.where);
      }
      return text;
    }
    case KeyType::kChoice: {
      if (r.kind == Raw::kBool && !s.bool_true.empty()) return r.b ? s.bool_true : s.bool_false;
      if (r.kind != Raw::kString) type_error(s, r);
      if (std::find(s.choices.begin(), s.choices.end(), r.s) == s.choices.end())
        MT_THROW(ConfigError, "{} must be {}, found {}{}", s.full_name(), s.accepted(),
                 config_value_to_string(r.s), r.where);
      return r.s;
    }
  }
  MT_THROW(InternalError, "unhandled key type for {}", s.full_name());
}

Raw raw_from_value(const ConfigValue& v, std::string where) {
  Raw r;
  r.where = std::move(where);
  if (auto* i = std::get_if<int64_t>(&v))
    r.kind = Raw::kInt, r.i = *i;
  else if (auto* d = std::get_if<double>(&v))
    r.kind = Raw::kFloat, r.d = *d;
  else if (auto* b = std::get_if<bool>(&v))
    r.kind = Raw::kBool, r.b = *b;
  else
    r.kind = Raw::kString, r.s = std::get<std::string>(v);
  return r;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<bool> parse_bool_text(std::string_view text) {
  std::string t = lower(text);
  if (t == "true" || t == "1") return true;
  if (t == "false" || t == "0") return false;
  return std::nullopt;
}

bool parse_int_text(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

bool parse_float_text(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

// Command-line text becomes the Raw the key's type would read from TOML, so the checks and
// error texts are shared: "abc" for an integer key is a string, "1.5" a float.
Raw raw_from_text(const KeySpec& s, const std::string& text, std::string where) {
  Raw r;
  r.where = std::move(where);
  r.kind = Raw::kString, r.s = text;
  switch (s.type) {
    case KeyType::kInt:
    case KeyType::kFloat:
      if (parse_int_text(text, &r.i))
        r.kind = Raw::kInt;
      else if (parse_float_text(text, &r.d))
        r.kind = Raw::kFloat;
      break;
    case KeyType::kBool:
      if (auto b = parse_bool_text(text)) r.kind = Raw::kBool, r.b = *b;
      break;
    case KeyType::kChoice:
      if (!s.bool_true.empty() &&
          std::find(s.choices.begin(), s.choices.end(), text) == s.choices.end())
        if (auto b = parse_bool_text(text)) r.kind = Raw::kBool, r.b = *b;
      break;
    case KeyType::kString: break;
  }
  return r;
}

Raw raw_from_toml(const toml::node& n, std::string where) {
  Raw r;
  r.where = std::move(where);
  switch (n.type()) {
    case toml::node_type::integer: r.kind = Raw::kInt, r.i = n.as_integer()->get(); break;
    case toml::node_type::floating_point:
      r.kind = Raw::kFloat, r.d = n.as_floating_point()->get();
      break;
    case toml::node_type::boolean: r.kind = Raw::kBool, r.b = n.as_boolean()->get(); break;
    case toml::node_type::string: r.kind = Raw::kString, r.s = n.as_string()->get(); break;
    case toml::node_type::array: {
      r.s = "an array";
      std::vector<std::string> items;
      for (const toml::node& e : *n.as_array())
        if (e.is_string()) items.push_back(e.as_string()->get());
      if (items.size() == n.as_array()->size()) r.strings = std::move(items);
      break;
    }
    case toml::node_type::table: r.s = "a table"; break;
    default: r.s = "a date/time"; break;
  }
  return r;
}

// ---- suggestions ----------------------------------------------------------

int suggestion_budget(std::string_view typed) { return std::max<int>(2, int(typed.size()) / 3); }

// The closest key to `[section] name`; a key of another section costs one edit more, so
// `[training] lr` suggests `[optimizer] lr`.
const KeySpec* closest_key(const Schema& schema, std::string_view section, std::string_view name) {
  const KeySpec* best = nullptr;
  int best_cost = suggestion_budget(name) + 1;
  for (const KeySpec& k : schema.keys()) {
    int cost = edit_distance(lower(name), k.name) + (k.section == section ? 0 : 1);
    if (cost < best_cost) best_cost = cost, best = &k;
  }
  return best;
}

std::string unknown_key_message(const Schema& schema, std::string_view section,
                                std::string_view name) {
  std::string msg = fmt::format("unknown key [{}] {}", section, name);
  if (const KeySpec* k = closest_key(schema, section, name))
    msg += fmt::format(" (did you mean {}?)", k->full_name());
  return msg;
}

std::string unknown_section_message(const Schema& schema, std::string_view section) {
  std::string msg = fmt::format("unknown section [{}]", section);
  std::string best;
  int best_cost = suggestion_budget(section) + 1;
  for (const std::string& s : schema.sections()) {
    int cost = edit_distance(lower(section), s);
    if (cost < best_cost) best_cost = cost, best = s;
  }
  if (!best.empty())
    msg += fmt::format(" (did you mean [{}]?)", best);
  else
    msg += fmt::format(" (known sections: {})", fmt::join(schema.sections(), ", "));
  return msg;
}

}  // namespace config_detail

int edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = int(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = int(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);  // a transposition is one typo
    }
  return d[n][m];
}

}  // namespace meshtrain
