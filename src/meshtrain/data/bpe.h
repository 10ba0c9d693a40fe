// Byte-level BPE: GPT-2's byte <-> printable-character alphabet, and a merge model kept in byte
// space (a symbol is the byte string it stands for). The merge loop always applies the
// lowest-ranked adjacent pair first (ties: the leftmost), never the longest vocabulary match.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

// GPT-2's stand-in character for each byte, as UTF-8: bytes 0x21..0x7E, 0xA1..0xAC and
// 0xAE..0xFF are their own code point, the other 68 take U+0100, U+0101, ... in byte order.
const std::array<std::string, 256>& byte_level_alphabet();

// Appends the bytes a byte-level token string stands for; false (out unchanged) when one of
// its characters is not in the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& out);
// The byte-level spelling of raw bytes (each byte's stand-in, concatenated).
std::string bytes_to_byte_level(std::string_view bytes);

// Heterogeneous lookup by string_view without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BytePairModel {
 public:
  struct Options {
    bool ignore_merges = false;  // a piece that is itself in the vocabulary is one token
    int32_t unk_id = -1;         // id for a byte without a token; -1 = that is a DataError
    std::string source;          // the file, for error messages
  };

  // `vocab` maps byte strings to ids; `merges` are (left, right) byte strings in rank order.
  // DataError (quoting the entry) for a merge whose parts or result are not in `vocab`.
  BytePairModel(StringIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                Options options);
  BytePairModel() = default;

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  int32_t id_of(std::string_view bytes) const;  // -1 when not in the vocabulary
  int64_t num_merges() const { return int64_t(merges_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  const Merge* find_merge(int32_t a, int32_t b) const;

  StringIdMap vocab_;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  Options opt_;
};

// A bounded cache of piece -> ids for one thread: open addressing over a power-of-two table,
// keys and ids in two arenas (no allocation per entry). When full it starts over empty.
class PieceCache {
 public:
  static constexpr size_t kMaxEntries = size_t(1) << 17;
  static constexpr size_t kMaxPieceBytes = 64;  // longer pieces are not cached

  // Appends the cached ids of `piece` to `out`; false when it is not cached.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, std::span<const int32_t> ids);
  void clear();
  size_t size() const { return entries_; }
  uint64_t owner = 0;  // which tokenizer filled it (the caller clears it for another)

 private:
  struct Slot {
    uint64_t hash = 0;  // 0 = empty
    uint32_t key_at = 0, ids_at = 0;
    uint16_t key_len = 0, n_ids = 0;
  };
  static uint64_t hash_of(std::string_view s);
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

}  // namespace meshtrain
