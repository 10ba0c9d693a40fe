// The names of the transformer blocks: block i is "layers.<i>" (torchtitan's module path and
// checkpoint names). The one place that spells the pattern: models name blocks (and so their
// parameters) through block_name, and code that reads a parameter NAME parses it here.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace meshtrain {

// "layers.<index>".
std::string block_name(int index);

struct ParsedBlockName {
  int index = -1;
  std::string suffix;  // what follows "layers.<index>.", "" for the block name itself
};
// The inverse of block_name, on a full name: "layers.3.attention.wq.weight" -> {3,
// "attention.wq.weight"}, "layers.3" -> {3, ""}; names outside the blocks (and non-canonical
// indices such as "01", a trailing dot) -> nullopt.
std::optional<ParsedBlockName> parse_block_name(std::string_view name);

}  // namespace meshtrain
