// Config loading: defaults, then TOML, then overrides, each value checked by one coerce() so a
// file value and a command-line value of the same key give the same error text.
#include "meshtrain/core/config.h"

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
#include "meshtrain/core/config_coerce.h"

namespace meshtrain {
using namespace config_detail;

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::kInt: return "an integer";
    case KeyType::kFloat: return "a number";
    case KeyType::kBool: return "a boolean";
    case KeyType::kString: return "a string";
    case KeyType::kChoice: return "a string";
  }
  return "a value";
}

// ---- KeySpec --------------------------------------------------------------------------------

static KeySpec make_spec(std::string section, std::string name, KeyType type, ConfigValue def,
                         std::string help) {
  KeySpec s;
  s.section = std::move(section), s.name = std::move(name), s.type = type;
  s.default_value = std::move(def), s.help = std::move(help);
  return s;
}
KeySpec KeySpec::integer(std::string section, std::string name, int64_t def, std::string help) {
  return make_spec(std::move(section), std::move(name), KeyType::kInt, def, std::move(help));
}
KeySpec KeySpec::real(std::string section, std::string name, double def, std::string help) {
  return make_spec(std::move(section), std::move(name), KeyType::kFloat, def, std::move(help));
}
KeySpec KeySpec::boolean(std::string section, std::string name, bool def, std::string help) {
  return make_spec(std::move(section), std::move(name), KeyType::kBool, def, std::move(help));
}
KeySpec KeySpec::string(std::string section, std::string name, std::string def, std::string help) {
  return make_spec(std::move(section), std::move(name), KeyType::kString, std::move(def),
                   std::move(help));
}
KeySpec KeySpec::choice(std::string section, std::string name, std::vector<std::string> choices,
                        std::string def, std::string help) {
  KeySpec s = make_spec(std::move(section), std::move(name), KeyType::kChoice, std::move(def),
                        std::move(help));
  s.choices = std::move(choices);
  return s;
}
KeySpec& KeySpec::at_least(double v) { return min = v, *this; }
KeySpec& KeySpec::at_most(double v) { return max = v, *this; }
KeySpec& KeySpec::in_range(double lo, double hi) { return min = lo, max = hi, *this; }
KeySpec& KeySpec::or_sentinel(ConfigValue v, std::string meaning) {
  return sentinel = std::move(v), sentinel_meaning = std::move(meaning), *this;
}
KeySpec& KeySpec::booleans_map_to(std::string if_true, std::string if_false) {
  return bool_true = std::move(if_true), bool_false = std::move(if_false), *this;
}
KeySpec& KeySpec::accepts_integers() { return int_as_string = true, *this; }
KeySpec& KeySpec::accepts_string_arrays() { return list_as_string = true, *this; }
KeySpec& KeySpec::validated_by(std::function<std::string(const std::string&)> f) {
  return validate = std::move(f), *this;
}
KeySpec& KeySpec::alias(std::string old_name) {
  return aliases.push_back(std::move(old_name)), *this;
}

std::string KeySpec::full_name() const { return fmt::format("[{}] {}", section, name); }

std::string config_value_to_string(const ConfigValue& v) {
  struct Visit {
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(double d) const {
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      std::string s = fmt::format("{}", d);  // shortest text that reads back to the same double
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& s) const {
      std::string out = "\"";
      for (unsigned char c : s) {
        if (c == '"' || c == '\\')
          out += '\\', out += char(c);
        else if (c == '\n')
          out += "\\n";
        else if (c == '\t')
          out += "\\t";
        else if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", c);
        else
          out += char(c);
      }
      return out + "\"";
    }
  };
  return std::visit(Visit{}, v);
}

// Bounds and sentinels read as numbers in messages ("in [0, 1]"), not as TOML floats ("1.0").
std::string KeySpec::accepted() const {
  switch (type) {
    case KeyType::kInt:
    case KeyType::kFloat: {
      std::string r = range_text(*this);
      return fmt::format("{}{}{}", key_type_name(type), r.empty() ? "" : " " + r,
                         sentinel_text(*this));
    }
    case KeyType::kBool: return "a boolean (true/false/1/0)";
    case KeyType::kString:
      return int_as_string    ? "a string or an integer"
             : list_as_string ? "a comma-separated string or an array of strings"
                              : "a string";
    case KeyType::kChoice: {
      std::string r = fmt::format("one of {}", fmt::join(choices, ", "));
      if (!bool_true.empty())
        r += fmt::format(" (or true = {}, false = {})", bool_true, bool_false);
      return r;
    }
  }
  return "a value";
}

// ---- Schema ---------------------------------------------------------------------------------

Schema& Schema::add(KeySpec spec) {
  MT_CHECK(!spec.section.empty() && !spec.name.empty(), "config key needs a section and a name");
  MT_CHECK(spec.type != KeyType::kChoice || !spec.choices.empty(), "{} has no choices",
           spec.full_name());
  // A default that fails its own spec is a schema bug; coerce() finds it with the user's text.
  try {
    (void)coerce(spec, raw_from_value(spec.default_value, " (schema default)"));
  } catch (const ConfigError& e) {
    MT_THROW(InternalError, "bad schema default: {}", e.message());
  }
  int idx = int(keys_.size());
  std::vector<std::string> names{spec.section + "." + spec.name};
  for (const std::string& a : spec.aliases) names.push_back(spec.section + "." + a);
  for (const std::string& n : names) {
    MT_CHECK(!index_.count(n), "config key {} is defined twice", n);
    index_.emplace(n, idx);
  }
  keys_.push_back(std::move(spec));
  return *this;
}

int Schema::index_of(std::string_view section, std::string_view name) const {
  auto it = index_.find(fmt::format("{}.{}", section, name));
  return it == index_.end() ? -1 : it->second;
}

const KeySpec* Schema::find(std::string_view section, std::string_view name) const {
  int i = index_of(section, name);
  return i < 0 ? nullptr : &keys_[size_t(i)];
}

std::vector<std::string> Schema::sections() const {
  std::vector<std::string> out;
  for (const KeySpec& k : keys_)
    if (std::find(out.begin(), out.end(), k.section) == out.end()) out.push_back(k.section);
  return out;
}

bool Schema::has_section(std::string_view section) const {
  return std::any_of(keys_.begin(), keys_.end(),
                     [&](const KeySpec& k) { return k.section == section; });
}

// ---- ConfigValues ---------------------------------------------------------------------------

ConfigValues::ConfigValues(Schema schema) : schema_(std::move(schema)) {
  for (const KeySpec& k : schema_.keys()) {
    values_.push_back(coerce(k, raw_from_value(k.default_value, "")));
    sources_.push_back(ValueSource::kDefault);
  }
}

int ConfigValues::require(std::string_view section, std::string_view key) const {
  int i = schema_.index_of(section, key);
  MT_CHECK(i >= 0, "config key [{}] {} is not in the schema", section, key);
  return i;
}

const ConfigValue& ConfigValues::get(std::string_view section, std::string_view key) const {
  return values_[size_t(require(section, key))];
}

template <typename T>
static const T& typed_get(const ConfigValue& v, std::string_view section, std::string_view key,
                          const char* want) {
  const T* p = std::get_if<T>(&v);
  MT_CHECK(p != nullptr, "config key [{}] {} is not {}", section, key, want);
  return *p;
}

int64_t ConfigValues::get_int(std::string_view section, std::string_view key) const {
  return typed_get<int64_t>(get(section, key), section, key, "an integer");
}
double ConfigValues::get_float(std::string_view section, std::string_view key) const {
  return typed_get<double>(get(section, key), section, key, "a float");
}
bool ConfigValues::get_bool(std::string_view section, std::string_view key) const {
  return typed_get<bool>(get(section, key), section, key, "a boolean");
}
const std::string& ConfigValues::get_string(std::string_view section, std::string_view key) const {
  return typed_get<std::string>(get(section, key), section, key, "a string");
}
ValueSource ConfigValues::source(std::string_view section, std::string_view key) const {
  return sources_[size_t(require(section, key))];
}

void ConfigValues::set(std::string_view section, std::string_view key, ConfigValue value,
                       ValueSource source) {
  const KeySpec* spec = schema_.find(section, key);
  if (!spec) MT_THROW(ConfigError, "{}", unknown_key_message(schema_, section, key));
  int i = schema_.index_of(section, key);
  values_[size_t(i)] = coerce(*spec, raw_from_value(value, ""));
  sources_[size_t(i)] = source;
}

std::string ConfigValues::to_toml() const {
  std::string out = "# Effective meshtrain configuration (defaults < config file < overrides).\n";
  for (const std::string& section : schema_.sections()) {
    out += fmt::format("\n[{}]\n", section);
    for (size_t i = 0; i < schema_.keys().size(); ++i) {
      const KeySpec& k = schema_.keys()[i];
      if (k.section != section) continue;
      if (!k.help.empty()) out += fmt::format("# {}\n", k.help);
      out += fmt::format("{} = {}\n", k.name, config_value_to_string(values_[i]));
    }
  }
  return out;
}

std::string ConfigValues::to_json(int indent) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < schema_.keys().size(); ++i) {
    const KeySpec& k = schema_.keys()[i];
    std::visit([&](const auto& v) { j[k.section][k.name] = v; }, values_[i]);
  }
  return j.dump(indent);
}

// ---- loading --------------------------------------------------------------------------------

namespace {

void apply_toml(ConfigValues& cfg, std::string_view text, const std::string& origin) {
  const Schema& schema = cfg.schema();
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    MT_THROW(ConfigError, "config file '{}' line {}, column {}: TOML syntax error: {}", origin,
             b.line, b.column, e.description());
  }
  auto where = [&](const toml::node& n) {
    return fmt::format(" ({} line {})", origin, n.source().begin.line);
  };
  std::vector<std::string> seen;  // canonical "section.key" given by this file, to catch aliases
  for (auto&& [section_key, section_node] : root) {
    std::string section(section_key.str());
    const toml::table* tbl = section_node.as_table();
    if (!tbl) {
      std::string msg = fmt::format("key '{}' at the top level of '{}': keys belong in a section",
                                    section, origin);
      for (const KeySpec& k : schema.keys())
        if (k.name == section) {
          msg += fmt::format(" (did you mean {}?)", k.full_name());
          break;
        }
      MT_THROW(ConfigError, "{}", msg);
    }
    if (!schema.has_section(section))
      MT_THROW(ConfigError, "{}{}", unknown_section_message(schema, section), where(section_node));
    for (auto&& [key, node] : *tbl) {
      std::string name(key.str());
      const KeySpec* spec = schema.find(section, name);
      if (!spec)
        MT_THROW(ConfigError, "{}{}", unknown_key_message(schema, section, name), where(node));
      std::string canonical = spec->section + "." + spec->name;
      if (std::find(seen.begin(), seen.end(), canonical) != seen.end())
        MT_THROW(ConfigError, "{} is given twice in '{}' (once under an older name){}",
                 spec->full_name(), origin, where(node));
      seen.push_back(canonical);
      cfg.set(spec->section, spec->name, coerce(*spec, raw_from_toml(node, where(node))),
              ValueSource::kFile);
    }
  }
}

void apply_overrides(ConfigValues& cfg, const std::vector<std::string>& args) {
  const Schema& schema = cfg.schema();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0)
      MT_THROW(ConfigError, "unexpected argument '{}': overrides look like --section.key value",
               arg);
    std::string body = arg.substr(2);
    std::optional<std::string> inline_value;
    if (size_t eq = body.find('='); eq != std::string::npos)
      inline_value = body.substr(eq + 1), body = body.substr(0, eq);
    size_t dot = body.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == body.size())
      MT_THROW(ConfigError, "override '{}' must name a key as --section.key", arg);
    std::string section = body.substr(0, dot), name = body.substr(dot + 1);
    if (!schema.has_section(section))
      MT_THROW(ConfigError, "{} in override '{}'", unknown_section_message(schema, section), arg);
    const KeySpec* spec = schema.find(section, name);
    if (!spec)
      MT_THROW(ConfigError, "{} in override '{}'", unknown_key_message(schema, section, name), arg);
    std::string where = fmt::format(" (from --{}.{})", section, name);
    std::string text;
    if (inline_value) {
      text = *inline_value;
    } else if (spec->type == KeyType::kBool) {
      // A bare boolean flag means true; a following true/false/1/0 is taken as its value.
      bool has_next = i + 1 < args.size() && parse_bool_text(args[i + 1]).has_value();
      text = has_next ? args[++i] : "true";
    } else {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
        MT_THROW(ConfigError, "override --{}.{} needs a value ({} expects {})", section, name,
                 spec->full_name(), spec->accepted());
      text = args[++i];
    }
    cfg.set(spec->section, spec->name, coerce(*spec, raw_from_text(*spec, text, where)),
            ValueSource::kOverride);
  }
}

}  // namespace

ConfigValues load_config_string(const Schema& schema, std::string_view toml_text,
                                const std::string& origin,
                                const std::vector<std::string>& overrides) {
  ConfigValues cfg(schema);
  apply_toml(cfg, toml_text, origin);
  apply_overrides(cfg, overrides);
  return cfg;
}

ConfigValues load_config(const Schema& schema, const std::string& toml_path,
                         const std::vector<std::string>& overrides) {
  ConfigValues cfg(schema);
  if (!toml_path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(toml_path, ec))
      MT_THROW(ConfigError, "config file '{}' not found", toml_path);
    std::ifstream in(toml_path, std::ios::binary);
    if (!in) MT_THROW(ConfigError, "config file '{}' cannot be opened for reading", toml_path);
    std::stringstream ss;
    ss << in.rdbuf();
    apply_toml(cfg, ss.str(), toml_path);
  }
  apply_overrides(cfg, overrides);
  return cfg;
}

}  // namespace meshtrain
