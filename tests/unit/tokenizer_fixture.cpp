// Builders of test tokenizer.json folders (see tokenizer_fixture.h).
#include "tokenizer_fixture.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "meshtrain/data/bpe.h"
#include "meshtrain/data/pretokenizer.h"

namespace meshtrain::testing {

using json = nlohmann::json;

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kDeepSeekV3Patterns[3] = {
    R"(\p{N}{1,3})",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^)"
    "\r\n"
    R"(\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[)"
    "\r\n"
    R"(]*|\s*[)"
    "\r\n"
    R"(]+|\s+(?!\S)|\s+)",
};

json byte_level_step(bool use_regex, bool add_prefix_space) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

namespace {
json isolated_split(const std::string& pattern) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}
}  // namespace

json llama3_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers", json::array({isolated_split(kLlama3Pattern), byte_level_step()})}};
}

json deepseek_v3_pre_tokenizer() {
  json steps = json::array();
  for (const char* p : kDeepSeekV3Patterns) steps.push_back(isolated_split(p));
  steps.push_back(byte_level_step());
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

int merged_id(const TokenizerSpec& spec, const std::string& bytes) {
  std::set<std::string> seen;
  int next = 256;
  for (const auto& [a, b] : spec.merges) {
    if (!seen.insert(a + b).second) continue;
    if (a + b == bytes) return next;
    ++next;
  }
  return -1;
}

json tokenizer_json(const TokenizerSpec& spec) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_alphabet()[size_t(b)]] = b;
  int next = 256;
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    const std::string la = bytes_to_byte_level(a), lb = bytes_to_byte_level(b);
    if (!vocab.contains(la + lb)) vocab[la + lb] = next++;
    if (spec.merges_as_pairs)
      merges.push_back(json::array({la, lb}));
    else
      merges.push_back(la + " " + lb);
  }
  json added = json::array();
  for (const AddedTokenSpec& t : spec.added)
    added.push_back({{"id", t.id},
                     {"content", t.content},
                     {"single_word", false},
                     {"lstrip", t.lstrip},
                     {"rstrip", t.rstrip},
                     {"normalized", false},
                     {"special", t.special}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", spec.normalizer},
          {"pre_tokenizer", spec.pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", byte_level_step(true, true)},
          {"model",
           {{"type", spec.model_type},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", spec.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

std::string write_tokenizer_folder(const std::string& dir, const TokenizerSpec& spec) {
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "tokenizer.json") << tokenizer_json(spec).dump();
  if (!spec.bos_token.empty() || !spec.eos_token.empty()) {
    json cfg = {{"add_bos_token", spec.add_bos_token}, {"model_max_length", 131072}};
    if (!spec.bos_token.empty()) cfg["bos_token"] = spec.bos_token;
    // The object form HF writes for AddedToken values.
    if (!spec.eos_token.empty())
      cfg["eos_token"] = {{"__type", "AddedToken"}, {"content", spec.eos_token}, {"special", true}};
    std::ofstream(std::filesystem::path(dir) / "tokenizer_config.json") << cfg.dump(2);
  }
  return dir;
}

std::vector<std::pair<std::string, std::string>> frequent_word_merges(
    const std::vector<std::string_view>& docs, const json& pre_tokenizer, int n_words) {
  const PreTokenizer pre = PreTokenizer::from_json(pre_tokenizer, "fixture");
  std::map<std::string, int64_t> counts;
  for (std::string_view d : docs)
    pre.split(d, [&](std::string_view piece) {
      if (piece.size() >= 2 && piece.size() <= 16) ++counts[std::string(piece)];
    });
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (auto& [w, c] : counts) ranked.emplace_back(-c, w);
  std::sort(ranked.begin(), ranked.end());
  if (int(ranked.size()) > n_words) ranked.resize(size_t(n_words));
  std::vector<std::pair<std::string, std::string>> merges;
  std::set<std::pair<std::string, std::string>> seen;
  for (auto& [c, w] : ranked)
    for (size_t k = 1; k < w.size(); ++k) {
      std::pair<std::string, std::string> m{w.substr(0, k), w.substr(k, 1)};
      if (seen.insert(m).second) merges.push_back(std::move(m));
    }
  return merges;
}

}  // namespace meshtrain::testing
