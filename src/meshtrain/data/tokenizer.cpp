// Byte-level tokenizer: encode is a widening copy, decode narrows and drops BOS/EOS.
#include "meshtrain/data/tokenizer.h"

#include "meshtrain/core/check.h"

namespace meshtrain {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

void ByteTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(int32_t(static_cast<unsigned char>(c)));
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

}  // namespace meshtrain
