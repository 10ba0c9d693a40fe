// Loading tokenizer.json / tokenizer_config.json, and encoding: added tokens are matched first on
// the raw text (leftmost, then longest), the text between them is normalized, pre-tokenized and
// BPE-encoded piece by piece through a per-thread cache of piece -> ids.
#include "meshtrain/data/hf_tokenizer.h"

#include <utf8proc.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK_T(DataError, static_cast<bool>(in), "cannot open '{}' for reading", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    MT_THROW(DataError, "'{}' is not valid JSON: {}", path, e.what());
  }
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string token_text(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::atomic<uint64_t> g_serial{0};

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  std::error_code ec;
  // A folder (torchtitan's hf_assets_path), or the tokenizer.json file itself.
  fs::path folder = fs::is_regular_file(path, ec) ? fs::path(path).parent_path() : fs::path(path);
  fs::path file = fs::is_regular_file(path, ec) ? fs::path(path) : folder / "tokenizer.json";
  MT_CHECK_T(DataError, fs::is_directory(folder.empty() ? "." : folder, ec),
             "[model] hf_assets_path '{}' is not a folder (expected a folder holding "
             "tokenizer.json and tokenizer_config.json)",
             path);
  MT_CHECK_T(DataError, fs::is_regular_file(file, ec),
             "[model] hf_assets_path '{}' has no tokenizer.json (expected a Hugging Face "
             "tokenizer folder: tokenizer.json, tokenizer_config.json)",
             path);
  t->folder_ = folder.string();
  t->file_ = file.string();
  t->serial_ = ++g_serial;
  t->parse_tokenizer_json(t->file_);
  fs::path cfg = folder / "tokenizer_config.json";
  if (fs::is_regular_file(cfg, ec)) t->parse_tokenizer_config(cfg.string());
  return t;
}

void HfTokenizer::parse_tokenizer_json(const std::string& path) {
  const json j = read_json(path);
  MT_CHECK_T(DataError, j.is_object() && j.contains("model") && j["model"].is_object(),
             "{}: expected a tokenizer.json object with a \"model\"", path);
  const json& m = j["model"];
  model_type_ = m.value("type", std::string("BPE"));
  MT_CHECK_T(DataError, model_type_ == "BPE",
             "{}: model type \"{}\" is not supported: meshtrain implements byte-level BPE "
             "(model type \"BPE\")",
             path, model_type_);
  auto unsupported_if = [&](bool bad, const char* key, const json& v) {
    MT_CHECK_T(DataError, !bad,
               "{}: model.{} = {} is not supported (byte-level BPE needs it unset)", path, key,
               v.dump());
  };
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = m.value(key, json());
    unsupported_if(!v.is_null() && !(v.is_string() && v.get<std::string>().empty()) &&
                       !(v.is_number() && v.get<double>() == 0.0),
                   key, v);
  }
  unsupported_if(m.value("byte_fallback", false), "byte_fallback",
                 m.value("byte_fallback", json()));

  // Vocabulary: spelling -> id; byte-level spellings also give the BPE's byte strings.
  MT_CHECK_T(DataError, m.contains("vocab") && m["vocab"].is_object(),
             "{}: model.vocab must be an object of token -> id", path);
  StringIdMap bytes_vocab;
  int32_t max_id = -1;
  std::vector<std::pair<int32_t, std::string>> decode_entries;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    MT_CHECK_T(DataError,
               it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                   it.value().get<int64_t>() < INT32_MAX,
               "{}: vocab entry \"{}\" must map to an id in [0, 2^31), found {}", path, it.key(),
               it.value().dump());
    const int32_t id = it.value().get<int32_t>();
    std::string bytes;
    if (byte_level_to_bytes(it.key(), bytes))
      bytes_vocab.emplace(bytes, id);
    else
      bytes = it.key();  // not a byte-level spelling: BPE never makes it; decodes as written
    by_spelling_[it.key()] = id;
    decode_entries.emplace_back(id, std::move(bytes));
    max_id = std::max(max_id, id);
  }

  // Merges: "a b" strings (older files) or [a, b] pairs, in rank order.
  std::vector<std::pair<std::string, std::string>> merges;
  const json mj = m.value("merges", json::array());
  MT_CHECK_T(DataError, mj.is_array(), "{}: model.merges must be an array", path);
  merges.reserve(mj.size());
  for (size_t r = 0; r < mj.size(); ++r) {
    std::string a, b;
    if (mj[r].is_string()) {
      const std::string s = mj[r].get<std::string>();
      const size_t sp = s.find(' ');
      MT_CHECK_T(DataError, sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                 "{}: merges entry {} \"{}\" must be two tokens separated by one space", path, r,
                 s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      MT_CHECK_T(
          DataError,
          mj[r].is_array() && mj[r].size() == 2 && mj[r][0].is_string() && mj[r][1].is_string(),
          "{}: merges entry {} must be \"a b\" or [\"a\", \"b\"], found {}", path, r, mj[r].dump());
      a = mj[r][0].get<std::string>(), b = mj[r][1].get<std::string>();
    }
    std::pair<std::string, std::string> pair;
    for (auto [part, dst] : {std::pair{&a, &pair.first}, std::pair{&b, &pair.second}}) {
      MT_CHECK_T(DataError, by_spelling_.count(*part),
                 "{}: merges entry {} (\"{} {}\") names \"{}\", which is not in the vocabulary",
                 path, r, a, b, *part);
      MT_CHECK_T(DataError, byte_level_to_bytes(*part, *dst),
                 "{}: merges entry {} (\"{} {}\") names \"{}\", which is not a byte-level token",
                 path, r, a, b, *part);
    }
    merges.push_back(std::move(pair));
  }
  BytePairModel::Options bo;
  bo.ignore_merges = m.value("ignore_merges", false);
  bo.source = path;
  const json unk = m.value("unk_token", json());
  if (unk.is_string()) {
    MT_CHECK_T(DataError, by_spelling_.count(unk.get<std::string>()),
               "{}: model.unk_token \"{}\" is not in the vocabulary", path, unk.get<std::string>());
    bo.unk_id = by_spelling_.at(unk.get<std::string>());
  }
  bpe_ = BytePairModel(std::move(bytes_vocab), merges, bo);

  // Normalizer: none, or one Unicode normalization form (alone or as a one-element Sequence).
  json nj = j.value("normalizer", json());
  if (nj.is_object() && nj.value("type", "") == "Sequence" && nj.contains("normalizers") &&
      nj["normalizers"].is_array() && nj["normalizers"].size() <= 1)
    nj = nj["normalizers"].empty() ? json() : nj["normalizers"][0];
  if (!nj.is_null()) {
    const std::string type = nj.is_object() ? nj.value("type", std::string("?")) : nj.dump();
    MT_CHECK_T(DataError, type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD",
               "{}: normalizer \"{}\" is not supported (supported: none, NFC, NFD, NFKC, NFKD)",
               path, type);
    normalizer_ = type;
  }
  pre_ = PreTokenizer::from_json(j.value("pre_tokenizer", json()), path);
  const json dj = j.value("decoder", json());
  const std::string decoder = dj.is_object() ? dj.value("type", std::string("?")) : "null";
  MT_CHECK_T(DataError, decoder == "ByteLevel",
             "{}: decoder \"{}\" is not supported (byte-level BPE decodes with ByteLevel)", path,
             decoder);

  // Added tokens: matched on the raw text before anything else; they decode as written.
  for (const json& a : j.value("added_tokens", json::array())) {
    MT_CHECK_T(DataError,
               a.is_object() && a.contains("content") && a["content"].is_string() &&
                   a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                   a["id"].get<int64_t>() < INT32_MAX && !a["content"].get<std::string>().empty(),
               "{}: added_tokens entries need a non-empty \"content\" and an \"id\" in [0, 2^31), "
               "found {}",
               path, a.dump());
    Added t{a["content"].get<std::string>(), a["id"].get<int32_t>(), a.value("lstrip", false),
            a.value("rstrip", false)};
    MT_CHECK_T(DataError, !a.value("single_word", false),
               "{}: added token \"{}\" has single_word = true, which is not supported", path,
               t.content);
    by_spelling_[t.content] = t.id;
    decode_entries.emplace_back(t.id, t.content);
    max_id = std::max(max_id, t.id);
    added_.push_back(std::move(t));
  }
  MT_CHECK_T(DataError, max_id >= 0, "{}: the vocabulary is empty", path);
  id_bytes_.assign(size_t(max_id) + 1, std::string());
  hole_.assign(size_t(max_id) + 1, true);
  for (auto& [id, bytes] : decode_entries)
    id_bytes_[size_t(id)] = std::move(bytes), hole_[size_t(id)] = false;
  build_added_trie();
}

void HfTokenizer::parse_tokenizer_config(const std::string& path) {
  const json cfg = read_json(path);
  MT_CHECK_T(DataError, cfg.is_object(), "{}: expected a JSON object", path);
  auto id_of = [&](const std::string& text, const char* key) {
    const int32_t id = token_id(text);
    MT_CHECK_T(DataError, id >= 0, "{}: {} \"{}\" is not a token of {}", path, key, text, file_);
    return id;
  };
  bos_token_ = token_text(cfg, "bos_token");
  eos_token_ = token_text(cfg, "eos_token");
  // BOS starts every document unless the config turns it off; EOS always ends one when the
  // tokenizer has it (torchtitan's text datasets encode with add_bos and add_eos).
  if (!bos_token_.empty() && cfg.value("add_bos_token", true))
    bos_ = id_of(bos_token_, "bos_token");
  if (!eos_token_.empty()) eos_ = id_of(eos_token_, "eos_token");
}

void HfTokenizer::build_added_trie() {
  trie_.assign(1, {});
  terminal_.assign(1, -1);
  for (size_t k = 0; k < added_.size(); ++k) {
    int32_t node = 0;
    for (unsigned char c : added_[k].content) {
      auto& kids = trie_[size_t(node)];
      auto it = std::find_if(kids.begin(), kids.end(), [&](auto& p) { return p.first == c; });
      if (it != kids.end()) {
        node = it->second;
        continue;
      }
      const int32_t child = int32_t(trie_.size());
      kids.emplace_back(c, child);
      trie_.emplace_back();
      terminal_.push_back(-1);
      node = child;
    }
    if (terminal_[size_t(node)] < 0) terminal_[size_t(node)] = int32_t(k);
    first_byte_[static_cast<unsigned char>(added_[k].content[0])] = true;
  }
}

int32_t HfTokenizer::match_added(std::string_view text, size_t pos, size_t& len) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& kids = trie_[size_t(node)];
    const auto c = static_cast<unsigned char>(text[i]);
    auto it = std::find_if(kids.begin(), kids.end(), [&](auto& p) { return p.first == c; });
    if (it == kids.end()) break;
    node = it->second;
    if (terminal_[size_t(node)] >= 0) best = terminal_[size_t(node)], len = i + 1 - pos;
  }
  return best;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

void HfTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    size_t len = 0;
    const int32_t k =
        first_byte_[static_cast<unsigned char>(text[i])] ? match_added(text, i, len) : -1;
    if (k < 0) {
      ++i;
      continue;
    }
    size_t b = i, e = i + len;
    if (added_[size_t(k)].lstrip)
      while (b > seg && ascii_space(text[b - 1])) --b;
    if (added_[size_t(k)].rstrip)
      while (e < text.size() && ascii_space(text[e])) ++e;
    encode_text(text.substr(seg, b - seg), out);
    out.push_back(added_[size_t(k)].id);
    seg = i = e;
  }
  encode_text(text.substr(seg), out);
}

void HfTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (!normalizer_.empty()) {
    int opts = UTF8PROC_STABLE;
    opts |= normalizer_.back() == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (normalizer_[2] == 'K') opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     utf8proc_ssize_t(text.size()), &dst, utf8proc_option_t(opts));
    MT_CHECK_T(DataError, n >= 0, "{}: normalizer {} cannot normalize the text: {}", file_,
               normalizer_, utf8proc_errmsg(n));
    normalized.assign(reinterpret_cast<const char*>(dst), size_t(n));
    std::free(dst);
    text = normalized;
  }
  thread_local PieceCache cache;
  if (cache.owner != serial_) cache.clear(), cache.owner = serial_;
  pre_.split(text, [&](std::string_view piece) {
    if (cache.lookup(piece, out)) return;
    const size_t start = out.size();
    bpe_.encode_piece(piece, out);
    cache.insert(piece, std::span<const int32_t>(out).subspan(start));
  });
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if ((id == bos_ || id == eos_) && id >= 0) continue;
    MT_CHECK_T(DataError, id >= 0 && id < vocab_size(),
               "{}: token id at position {} must be in [0, {}), found {}", file_, i, vocab_size(),
               id);
    MT_CHECK_T(DataError, !hole_[size_t(id)], "{}: token id {} at position {} has no token", file_,
               id, i);
    out += id_bytes_[size_t(id)];
  }
  return out;
}

int32_t HfTokenizer::token_id(const std::string& token) const {
  auto it = by_spelling_.find(token);
  return it == by_spelling_.end() ? -1 : it->second;
}

std::string HfTokenizer::name() const {
  auto special = [&](int32_t id, const std::string& t) {
    return id < 0 ? std::string("none") : fmt::format("{} {}", id, t);
  };
  return fmt::format(
      "{}: byte-level BPE, {} ids, {} merges, {} added tokens, normalizer {}, pre-tokenizer {}{}, "
      "BOS {}, EOS {}",
      file_, vocab_size(), bpe_.num_merges(), added_.size(),
      normalizer_.empty() ? "none" : normalizer_, pre_.describe(),
      pre_.all_jit() ? "" : " (PCRE2 without JIT)", special(bos_, bos_token_),
      special(eos_, eos_token_));
}

}  // namespace meshtrain
