// Attrs storage: a short vector of (key, value), kept sorted by key so equal maps compare equal.
#include "meshtrain/ir/attrs.h"

#include <algorithm>

#include "meshtrain/core/check.h"

namespace meshtrain {

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(const std::string& key, AttrValue v) {
  auto it = std::lower_bound(items_.begin(), items_.end(), key,
                             [](const auto& p, const std::string& k) { return p.first < k; });
  if (it != items_.end() && it->first == key)
    it->second = std::move(v);
  else
    items_.insert(it, {key, std::move(v)});
  return *this;
}

const AttrValue* Attrs::find(const std::string& key) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), key,
                             [](const auto& p, const std::string& k) { return p.first < k; });
  return (it != items_.end() && it->first == key) ? &it->second : nullptr;
}

const AttrValue& Attrs::get(const std::string& key) const {
  const AttrValue* v = find(key);
  MT_CHECK(v != nullptr, "node attribute '{}' missing (have: {})", key, to_string());
  return *v;
}

bool Attrs::has(const std::string& key) const { return find(key) != nullptr; }

int64_t Attrs::i(const std::string& key) const {
  const AttrValue& v = get(key);
  MT_CHECK(std::holds_alternative<int64_t>(v), "attribute '{}' is not an int", key);
  return std::get<int64_t>(v);
}
int64_t Attrs::i(const std::string& key, int64_t fallback) const {
  return has(key) ? i(key) : fallback;
}
double Attrs::f(const std::string& key) const {
  const AttrValue& v = get(key);
  if (std::holds_alternative<int64_t>(v)) return double(std::get<int64_t>(v));
  MT_CHECK(std::holds_alternative<double>(v), "attribute '{}' is not a float", key);
  return std::get<double>(v);
}
double Attrs::f(const std::string& key, double fallback) const {
  return has(key) ? f(key) : fallback;
}
const std::string& Attrs::s(const std::string& key) const {
  const AttrValue& v = get(key);
  MT_CHECK(std::holds_alternative<std::string>(v), "attribute '{}' is not a string", key);
  return std::get<std::string>(v);
}
std::string Attrs::s(const std::string& key, const std::string& fallback) const {
  return has(key) ? s(key) : fallback;
}
const std::vector<int64_t>& Attrs::ints(const std::string& key) const {
  const AttrValue& v = get(key);
  MT_CHECK(std::holds_alternative<std::vector<int64_t>>(v), "attribute '{}' is not an int list",
           key);
  return std::get<std::vector<int64_t>>(v);
}

MeshGroup Attrs::group(const std::string& key) const {
  return mesh_group_from_int(i(key), "attribute '" + key + "'");
}

std::string Attrs::to_string() const {
  std::string out;
  for (const auto& [k, v] : items_) {
    if (!out.empty()) out += ", ";
    out += k + "=";
    if (k == "group" && std::holds_alternative<int64_t>(v)) {  // a mesh group: show its name
      const int64_t g = std::get<int64_t>(v);
      out += g >= 0 && g < kNumMeshGroups ? mesh_group_name(MeshGroup(g)) : std::to_string(g);
      continue;
    }
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>)
            out += fmt::format("[{}]", fmt::join(x, ","));
          else
            out += fmt::format("{}", x);
        },
        v);
  }
  return out;
}

}  // namespace meshtrain
