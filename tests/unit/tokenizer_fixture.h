// tokenizer.json folders built by tests and the tokenizer benchmark: the 256-byte alphabet with
// id = byte value, then the merges and added tokens the caller lists (a merge's result takes the
// next free id, 256 upward), so every expected id can be worked out by hand.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain::testing {

// The pre-tokenizer patterns of Llama-3 and DeepSeek-V3 as their tokenizer.json files hold them
// (decoded from JSON); DeepSeek-V3 applies its three in sequence.
extern const char* const kLlama3Pattern;
extern const char* const kDeepSeekV3Patterns[3];

nlohmann::json llama3_pre_tokenizer();       // Split(pattern, Isolated) + ByteLevel(no regex)
nlohmann::json deepseek_v3_pre_tokenizer();  // three Splits + ByteLevel(no regex)
nlohmann::json byte_level_step(bool use_regex = false, bool add_prefix_space = false);

struct AddedTokenSpec {
  std::string content;
  int id;
  bool special = true;
  bool lstrip = false, rstrip = false;
};

struct TokenizerSpec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, in rank order
  nlohmann::json pre_tokenizer = llama3_pre_tokenizer();
  nlohmann::json normalizer;  // null
  std::vector<AddedTokenSpec> added;
  bool ignore_merges = false;
  bool merges_as_pairs = false;  // [a, b] arrays instead of "a b" strings
  std::string model_type = "BPE";
  // tokenizer_config.json; "" leaves the key out; no file at all when both are "".
  std::string bos_token, eos_token;
  bool add_bos_token = true;
};

nlohmann::json tokenizer_json(const TokenizerSpec& spec);
// Writes dir/tokenizer.json (and dir/tokenizer_config.json) and returns dir.
std::string write_tokenizer_folder(const std::string& dir, const TokenizerSpec& spec);
// The id write_tokenizer_folder gives a merge result (first merge making it: 256 + its order).
int merged_id(const TokenizerSpec& spec, const std::string& bytes);

// Merges that spell the `n_words` most frequent pieces of `docs` (under the spec's
// pre-tokenizer) left to right, one byte at a time, most frequent first; ties by bytes.
std::vector<std::pair<std::string, std::string>> frequent_word_merges(
    const std::vector<std::string_view>& docs, const nlohmann::json& pre_tokenizer, int n_words);

}  // namespace meshtrain::testing
