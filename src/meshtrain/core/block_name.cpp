// block_name and its inverse (see block_name.h).
#include "meshtrain/core/block_name.h"

#include <charconv>

namespace meshtrain {

namespace {
constexpr std::string_view kBlockPrefix = "layers.";
}  // namespace

std::string block_name(int index) { return std::string(kBlockPrefix) + std::to_string(index); }

std::optional<ParsedBlockName> parse_block_name(std::string_view name) {
  if (name.substr(0, kBlockPrefix.size()) != kBlockPrefix) return std::nullopt;
  const std::string_view rest = name.substr(kBlockPrefix.size());
  const size_t dot = rest.find('.');
  const std::string_view digits = rest.substr(0, dot);
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  ParsedBlockName parsed;
  const auto [end, err] =
      std::from_chars(digits.data(), digits.data() + digits.size(), parsed.index);
  if (err != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (dot != std::string_view::npos) {
    parsed.suffix = std::string(rest.substr(dot + 1));
    if (parsed.suffix.empty()) return std::nullopt;  // "layers.3."
  }
  return parsed;
}

}  // namespace meshtrain
