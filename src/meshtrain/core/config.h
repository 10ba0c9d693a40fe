// Schema-driven TOML configuration with torchtitan-style `--section.key value` overrides.
// Precedence: override > file > default; every value is validated against its key's spec, and
// every error is one ConfigError line naming the key, what it accepts and what was found.
// Each key also carries its disposition: honoured, accepted but ignored (with a note), or
// rejected at any value but the ones meshtrain can honour.
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

enum class KeyType { kInt, kFloat, kBool, kString, kChoice, kList };
const char* key_type_name(KeyType type);  // "an integer", "a float", ...

// A stored value. kChoice keys hold their choice as a string, kList keys a list of strings.
using StringList = std::vector<std::string>;
using ConfigValue = std::variant<int64_t, double, bool, std::string, StringList>;

// What meshtrain does with a key (torchtitan's keys are all recognised; not all are honoured).
enum class Disposition {
  kImplemented,  // works as in torchtitan
  kIgnored,      // accepted at any value; a startup note says what meshtrain does instead
  kRejected,     // accepted only at the values meshtrain honours (the default unless told)
};

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
  // The same key under another section ({"debug", "seed"} for [training] seed: torchtitan moved
  // it between v0.2 releases).
  std::vector<std::pair<std::string, std::string>> section_aliases;
  // kList keys: a list of lists (each inner list stored comma-joined), and whether a single
  // string is accepted as a comma-separated list (torchtitan's `list[str] | str`).
  bool nested_list = false;
  bool list_or_string = false;

  Disposition disposition = Disposition::kImplemented;
  // kIgnored: what meshtrain does instead (a function of the value the user gave);
  // kRejected: why other values cannot be honoured.
  std::function<std::string(const ConfigValue&)> note;
  // The values that are honoured (kRejected keys: the default too, always), and the reason
  // others are an error.
  std::function<bool(const ConfigValue&)> honoured;
  std::string reject_why;

  static KeySpec integer(std::string section, std::string name, int64_t def, std::string help);
  static KeySpec real(std::string section, std::string name, double def, std::string help);
  static KeySpec boolean(std::string section, std::string name, bool def, std::string help);
  static KeySpec string(std::string section, std::string name, std::string def, std::string help);
  static KeySpec choice(std::string section, std::string name, std::vector<std::string> choices,
                        std::string def, std::string help);
  static KeySpec list(std::string section, std::string name, StringList def, std::string help);

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
  KeySpec& also_in(std::string section, std::string name);
  KeySpec& nested() { return nested_list = true, *this; }
  KeySpec& or_string() { return list_or_string = true, *this; }
  // Accepted at any value, with a note on what meshtrain does instead.
  KeySpec& ignored(std::string note);
  KeySpec& ignored_with(std::function<std::string(const ConfigValue&)> note);
  // Accepted only at the default (or where `honoured` says yes); else an error quoting `why`.
  KeySpec& rejected(std::string why, std::function<bool(const ConfigValue&)> honoured = {});
  // An honoured key some of whose values are not (activation_checkpoint mode memory_budget).
  KeySpec& honours_only(std::function<bool(const ConfigValue&)> honoured, std::string why);

  std::string full_name() const;  // "[training] steps"
  std::string accepted() const;   // "an integer >= 1", "one of llama3, deepseek_v3", ...
  std::string type_text() const;  // "int", "float", "bool", "str", "list[str]", "a|b|c"
};

class Schema {
 public:
  // Throws InternalError on a duplicate key or a default that violates its own spec.
  Schema& add(KeySpec spec);
  const KeySpec* find(std::string_view section, std::string_view name) const;  // aliases too
  int index_of(std::string_view section, std::string_view name) const;         // -1 if absent
  const std::vector<KeySpec>& keys() const { return keys_; }
  std::vector<std::string> sections() const;         // in order of first appearance
  bool has_section(std::string_view section) const;  // sections of aliases too
  // "quantize" for [quantize.linear.float8]: a table that only holds sections.
  bool has_section_prefix(std::string_view prefix) const;

  // Every key grouped by section: name, type, default, one-line help, and for keys meshtrain
  // does not honour, the note. The text of `meshtrain train --help`.
  std::string help_text() const;

 private:
  std::vector<KeySpec> keys_;
  std::map<std::string, int, std::less<>> index_;  // "section.name" and aliases -> key index
  std::vector<std::string> alias_sections_;        // sections that hold only aliases ([debug])
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

  // One line per ignored key that the file or the command line set:
  // "[compile] enable = false: the whole step is always compiled into one graph; ignored".
  std::vector<std::string> ignored_notes() const;

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
