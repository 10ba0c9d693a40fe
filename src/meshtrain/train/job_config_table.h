// Internal to train/job_config*: one row of the job-config table binds a key's spec (type,
// default, help, disposition) to a JobConfig field. Honoured keys bind to struct fields; keys
// meshtrain ignores or rejects bind to JobConfig::unhonoured, so the effective config keeps them.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/train/job_config.h"

namespace meshtrain::job_config_detail {

struct Binding {
  KeySpec spec;
  std::function<void(JobConfig&, const ConfigValue&)> load;
  std::function<ConfigValue(const JobConfig&)> store;

  Binding& at_least(double v) { return spec.at_least(v), *this; }
  Binding& in_range(double lo, double hi) { return spec.in_range(lo, hi), *this; }
  Binding& or_sentinel(ConfigValue v, std::string meaning) {
    return spec.or_sentinel(std::move(v), std::move(meaning)), *this;
  }
  Binding& alias(std::string a) { return spec.alias(std::move(a)), *this; }
  Binding& also_in(std::string section, std::string name) {
    return spec.also_in(std::move(section), std::move(name)), *this;
  }
};

// A plain field: int, int64_t, double, bool or std::string (a free string, or a choice when
// `choices` is non-empty). The schema default is the field's value in JobConfig{}.
template <typename Sec, typename T>
Binding field(const char* section, const char* name, Sec JobConfig::*sec, T Sec::*member,
              std::string help, std::vector<std::string> choices = {}) {
  static const JobConfig defaults{};
  const T& def = defaults.*sec.*member;
  Binding b;
  if constexpr (std::is_same_v<T, bool>) {
    b.spec = KeySpec::boolean(section, name, def, std::move(help));
  } else if constexpr (std::is_integral_v<T>) {
    b.spec = KeySpec::integer(section, name, int64_t(def), std::move(help));
  } else if constexpr (std::is_floating_point_v<T>) {
    b.spec = KeySpec::real(section, name, double(def), std::move(help));
  } else {
    static_assert(std::is_same_v<T, std::string>);
    b.spec = choices.empty()
                 ? KeySpec::string(section, name, def, std::move(help))
                 : KeySpec::choice(section, name, std::move(choices), def, std::move(help));
  }
  std::string full = b.spec.full_name();
  b.load = [sec, member, full](JobConfig& c, const ConfigValue& v) {
    T& dst = c.*sec.*member;
    if constexpr (std::is_same_v<T, bool>) {
      dst = std::get<bool>(v);
    } else if constexpr (std::is_integral_v<T>) {
      int64_t i = std::get<int64_t>(v);
      if constexpr (sizeof(T) < sizeof(int64_t))
        if (i < int64_t(std::numeric_limits<T>::min()) ||
            i > int64_t(std::numeric_limits<T>::max()))
          MT_THROW(ConfigError, "{} must fit in a 32-bit integer, found {}", full, i);
      dst = T(i);
    } else if constexpr (std::is_floating_point_v<T>) {
      dst = std::get<double>(v);
    } else {
      dst = std::get<std::string>(v);
    }
  };
  b.store = [sec, member](const JobConfig& c) -> ConfigValue {
    const T& v = c.*sec.*member;
    if constexpr (std::is_same_v<T, bool>)
      return v;
    else if constexpr (std::is_integral_v<T>)
      return int64_t(v);
    else if constexpr (std::is_floating_point_v<T>)
      return double(v);
    else
      return v;
  };
  return b;
}

// The one parse of a closed-choice key: the value of `values` whose TOML spelling is `s`. The
// schema has checked `s` against the choices (with its own message); a miss here is an internal
// error.
template <typename E, typename NameOf>
E parse_choice(const std::vector<E>& values, NameOf name_of, const std::string& s,
               const std::string& key) {
  for (const E& v : values)
    if (s == name_of(v)) return v;
  MT_THROW(ConfigError, "{} must be one of its choices, found \"{}\"", key, s);
}

// A closed-choice key stored typed (an enum, a DType): `values` in the order the schema lists
// them, `name_of` their TOML spelling. `refused` are further spellings the schema accepts and then
// refuses with a reason (KeySpec::honours_only), so they never reach the field.
template <typename Sec, typename E, typename NameOf>
Binding choice_field(const char* section, const char* name, Sec JobConfig::*sec, E Sec::*member,
                     std::string help, std::vector<E> values, NameOf name_of,
                     std::vector<std::string> refused = {}) {
  static const JobConfig defaults{};
  std::vector<std::string> choices;
  for (const E& v : values) choices.emplace_back(name_of(v));
  choices.insert(choices.end(), refused.begin(), refused.end());
  Binding b;
  b.spec = KeySpec::choice(section, name, std::move(choices),
                           std::string(name_of(defaults.*sec.*member)), std::move(help));
  std::string full = b.spec.full_name();
  b.load = [sec, member, values, name_of, full](JobConfig& c, const ConfigValue& v) {
    c.*sec.*member = parse_choice(values, name_of, std::get<std::string>(v), full);
  };
  b.store = [sec, member, name_of](const JobConfig& c) -> ConfigValue {
    return std::string(name_of(c.*sec.*member));
  };
  return b;
}

// A torchtitan key meshtrain does not honour: its spec says ignored or rejected (and why); the
// value lives in JobConfig::unhonoured under "section.name".
Binding unhonoured(KeySpec spec);

// The rows of torchtitan v0.2 keys that meshtrain ignores or rejects (job_config_compat.cpp),
// appended after the honoured rows of each section.
void add_unhonoured_rows(std::vector<Binding>& table);

}  // namespace meshtrain::job_config_detail
