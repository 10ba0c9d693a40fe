// Attrs: the small typed attribute map a graph node carries (ints, floats, strings, int lists).
// Lookups name the missing key and the op, so a malformed node fails with a clear message. A mesh
// group is stored as its enum value (an int); group() reads it back, checked.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "meshtrain/core/mesh_group.h"

namespace meshtrain {

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(const std::string& key, AttrValue v);
  bool has(const std::string& key) const;

  int64_t i(const std::string& key) const;
  int64_t i(const std::string& key, int64_t fallback) const;
  double f(const std::string& key) const;
  double f(const std::string& key, double fallback) const;
  const std::string& s(const std::string& key) const;
  std::string s(const std::string& key, const std::string& fallback) const;
  const std::vector<int64_t>& ints(const std::string& key) const;
  bool b(const std::string& key, bool fallback = false) const { return i(key, fallback) != 0; }
  // The mesh group of a collective (attr "group", set as int64_t(MeshGroup)).
  MeshGroup group(const std::string& key = "group") const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string to_string() const;
  bool operator==(const Attrs& o) const { return items_ == o.items_; }

 private:
  const AttrValue* find(const std::string& key) const;
  const AttrValue& get(const std::string& key) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace meshtrain
