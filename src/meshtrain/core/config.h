// Schema-driven TOML configuration with torchtitan-style `--section.key value` overrides.
// Precedence: override > file > default; every value is validated against its key's spec, and
// every error is one ConfigError line naming the key, what it accepts and what was found.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace meshtrain {

enum class KeyType { kInt, kFloat, kBool, kString, kChoice };
const char* key_type_name(KeyType type);  // "an integer", "a float", ...

// A stored value. kChoice keys hold their choice as a string.
using ConfigValue = std::variant<int64_t, double, bool, std::string>;

// One key of a schema. Build with the factories, refine with the chained setters:
//   KeySpec::integer("training", "steps", 10000, "How many train steps to run").at_least(1)
struct KeySpec {
  std::string section;
  std::string name;
  KeyType type = KeyType::kString;
  ConfigValue default_value;
  std::string help;                  // one line
  std::optional<double> min, max;    // kInt and kFloat only
  std::vector<std::string> choices;  // kChoice only
  // kInt/kFloat: a number accepted outside [min, max] that means "unset" or "auto" (messages
  // say "(or -1 = auto)"), e.g. -1 for global_batch_size. TOML has no null; sentinels stand in.
  std::optional<ConfigValue> sentinel;
  std::string sentinel_meaning;
  // kChoice keys that also accept booleans: true maps to bool_true, false to bool_false.
  std::string bool_true, bool_false;
  // kString keys that also accept a TOML integer, stored as its decimal text ("2").
  bool int_as_string = false;
  // kString keys holding a list (torchtitan's list[str] fields): a TOML array of strings is
  // stored comma-joined, as the command line spells it ("a,b").
  bool list_as_string = false;
  // kString keys: returns "" when the text is acceptable, else what is accepted (for the error).
  std::function<std::string(const std::string&)> validate;
  // Older names accepted for this key (e.g. torchtitan's lr_min for min_lr_factor).
  std::vector<std::string> aliases;

  static KeySpec integer(std::string section, std::string name, int64_t def, std::string help);
  static KeySpec real(std::string section, std::string name, double def, std::string help);
  static KeySpec boolean(std::string section, std::string name, bool def, std::string help);
  static KeySpec string(std::string section, std::string name, std::string def, std::string help);
  static KeySpec choice(std::string section, std::string name, std::vector<std::string> choices,
                        std::string def, std::string help);

  // Chained refinements (defined in config.cpp).
  KeySpec& at_least(double v);
  KeySpec& at_most(double v);
  KeySpec& in_range(double lo, double hi);
  KeySpec& or_sentinel(ConfigValue v, std::string meaning = "unset");
  KeySpec& booleans_map_to(std::string if_true, std::string if_false);
  KeySpec& accepts_integers();
  KeySpec& accepts_string_arrays();
  KeySpec& validated_by(std::function<std::string(const std::string&)> f);
  KeySpec& alias(std::string old_name);

  std::string full_name() const;  // "[training] steps"
  std::string accepted() const;   // "an integer >= 1", "one of llama3, deepseek_v3", ...
};

class Schema {
 public:
  // Throws InternalError on a duplicate key or a default that violates its own spec.
  Schema& add(KeySpec spec);
  const KeySpec* find(std::string_view section, std::string_view name) const;  // aliases too
  int index_of(std::string_view section, std::string_view name) const;         // -1 if absent
  const std::vector<KeySpec>& keys() const { return keys_; }
  std::vector<std::string> sections() const;  // in order of first appearance
  bool has_section(std::string_view section) const;

 private:
  std::vector<KeySpec> keys_;
  std::map<std::string, int, std::less<>> index_;  // "section.name" and aliases -> key index
};

enum class ValueSource { kDefault, kFile, kOverride };

// The effective configuration: one validated value per schema key, plus where it came from.
class ConfigValues {
 public:
  ConfigValues() = default;
  explicit ConfigValues(Schema schema);  // every key at its default

  const Schema& schema() const { return schema_; }
  int64_t get_int(std::string_view section, std::string_view key) const;
  double get_float(std::string_view section, std::string_view key) const;
  bool get_bool(std::string_view section, std::string_view key) const;
  const std::string& get_string(std::string_view section, std::string_view key) const;  // +choice
  const ConfigValue& get(std::string_view section, std::string_view key) const;
  ValueSource source(std::string_view section, std::string_view key) const;

  // Validates like a file value would be (ConfigError on a bad one); records `source`.
  void set(std::string_view section, std::string_view key, ConfigValue value,
           ValueSource source = ValueSource::kOverride);

  // TOML that load_config reads back to the same values; each key preceded by its help.
  std::string to_toml() const;
  std::string to_json(int indent = 2) const;  // {"section": {"key": value}}

 private:
  int require(std::string_view section, std::string_view key) const;
  Schema schema_;
  std::vector<ConfigValue> values_;
  std::vector<ValueSource> sources_;
};

// Loads defaults, then the TOML file (when toml_path is non-empty), then the overrides.
ConfigValues load_config(const Schema& schema, const std::string& toml_path,
                         const std::vector<std::string>& overrides);

// Same, with the TOML given as text (`origin` names it in error messages). For tests and tools.
ConfigValues load_config_string(const Schema& schema, std::string_view toml_text,
                                const std::string& origin,
                                const std::vector<std::string>& overrides);

// Damerau (optimal string alignment) edit distance, used for "did you mean" suggestions.
int edit_distance(std::string_view a, std::string_view b);

// Formats a value as TOML would spell it: 3, 0.5, true, "text".
std::string config_value_to_string(const ConfigValue& v);

}  // namespace meshtrain
