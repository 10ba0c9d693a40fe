// The Hugging Face tokenizer of a model folder (tokenizer.json + tokenizer_config.json):
// byte-level BPE with the file's vocabulary, merges, normalizer, pre-tokenizer and added tokens.
// Anything in the file that would change the ids and is not implemented is a DataError naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/bpe.h"
#include "meshtrain/data/pretokenizer.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

class HfTokenizer final : public Tokenizer {
 public:
  // `folder` holds tokenizer.json (required) and tokenizer_config.json (optional: BOS/EOS).
  static std::unique_ptr<HfTokenizer> load(const std::string& folder);

  std::vector<int32_t> encode(std::string_view text) const override;
  void encode_into(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return int32_t(id_bytes_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  std::string name() const override;
  std::string source() const override { return file_; }

  // The id of a vocabulary or added token as spelled in tokenizer.json; -1 when none.
  int32_t token_id(const std::string& token) const;

 private:
  struct Added {
    std::string content;
    int32_t id;
    bool lstrip, rstrip;
  };
  HfTokenizer() = default;
  void parse_tokenizer_json(const std::string& path);
  void parse_tokenizer_config(const std::string& path);
  void build_added_trie();
  // Longest added token starting at text[pos]: its index in added_, -1 when none.
  int32_t match_added(std::string_view text, size_t pos, size_t& len) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // no added tokens

  std::string folder_, file_;
  uint64_t serial_ = 0;  // keys the per-thread piece cache
  BytePairModel bpe_;
  PreTokenizer pre_;
  std::string normalizer_;  // "" or a utf8proc form: NFC, NFD, NFKC, NFKD
  std::vector<Added> added_;
  // Byte trie over added-token contents: node -> (byte -> child); terminal[node] = added index.
  std::vector<std::vector<std::pair<unsigned char, int32_t>>> trie_;
  std::vector<int32_t> terminal_;
  std::array<bool, 256> first_byte_{};
  std::vector<std::string> id_bytes_;  // decode table; an id without a token is empty + hole_
  std::vector<bool> hole_;
  StringIdMap by_spelling_;  // tokenizer.json spelling -> id (vocab and added tokens)
  int32_t bos_ = -1, eos_ = -1;
  std::string bos_token_, eos_token_, model_type_;
};

}  // namespace meshtrain
