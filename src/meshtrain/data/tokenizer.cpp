// Byte-level tokenizer: encode is a widening copy, decode narrows and drops BOS/EOS; the factory
// that picks the run's tokenizer.
#include "meshtrain/data/tokenizer.h"

#include "meshtrain/core/check.h"
#include "meshtrain/data/hf_tokenizer.h"

namespace meshtrain {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

void ByteTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  // resize, not reserve: callers append many documents to one buffer, and an exact reserve per
  // call would copy the whole buffer every time.
  const size_t at = out.size();
  out.resize(at + text.size());
  for (size_t i = 0; i < text.size(); ++i)
    out[at + i] = int32_t(static_cast<unsigned char>(text[i]));
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id == kBos || id == kEos) continue;
    MT_CHECK_T(DataError, id >= 0 && id < kVocabSize,
               "byte tokenizer: token id at position {} must be in [0, {}), found {}", i,
               kVocabSize, id);
    out.push_back(char(static_cast<unsigned char>(id)));
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  MT_THROW(DataError, "unknown tokenizer '{}': expected one of byte", name);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& hf_assets_path) {
  if (hf_assets_path.empty()) return std::make_unique<ByteTokenizer>();
  return HfTokenizer::load(hf_assets_path);
}

}  // namespace meshtrain
