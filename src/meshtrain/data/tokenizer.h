// Tokenizer interface and the byte-level tokenizer: ids 0..255 are the bytes themselves, 256 is
// BOS and 257 is EOS, so any byte string round-trips exactly and the vocabulary is 258.
// Implementations are immutable after construction: encode/decode may run on many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids, without BOS/EOS (the loader adds them around each document).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Appends the ids of `text` to `out` (lets callers tokenize a corpus into one buffer).
  virtual void encode_into(std::string_view text, std::vector<int32_t>& out) const = 0;
  // Ids to text; BOS/EOS are dropped. DataError on an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;  // largest id + 1
  // The ids the loader puts before / after every document; -1 = none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual std::string name() const = 0;  // for the start-up log
  // The file the vocabulary comes from ("" for built-in tokenizers), for error messages.
  virtual std::string source() const { return ""; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kVocabSize = 258;

  std::vector<int32_t> encode(std::string_view text) const override;
  void encode_into(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::string name() const override { return "byte (258 ids: 256 bytes, BOS 256, EOS 257)"; }
};

// "byte" is the only built-in tokenizer today; DataError for any other name.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name);

// The tokenizer of a run: the Hugging Face tokenizer in `hf_assets_path` ([model] hf_assets_path:
// a folder with tokenizer.json), or the byte tokenizer when it is "".
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& hf_assets_path);

}  // namespace meshtrain
