// Byte-level alphabet tables and the BPE merge loop: a linked list of symbols and a min-heap of
// candidate pairs keyed (rank, position); a popped pair whose symbols changed since it was pushed
// is stale and skipped. Scratch vectors are per thread, so encode_piece is const and thread-safe.
#include "meshtrain/data/bpe.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

bool keeps_own_code_point(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {  // the alphabet stays below U+0800: two bytes
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct Alphabet {
  std::array<std::string, 256> chars;
  std::array<int16_t, 0x144> byte_of;  // code point -> byte, -1 when not a stand-in
  Alphabet() {
    byte_of.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = keeps_own_code_point(b) ? uint32_t(b) : next++;
      chars[size_t(b)] = utf8_of(cp);
      byte_of[cp] = int16_t(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::array<std::string, 256>& byte_level_alphabet() { return alphabet().chars; }

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  const Alphabet& a = alphabet();
  const size_t start = out.size();
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    if (p[i] < 0x80) {
      cp = p[i], i += 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < token.size() && (p[i + 1] & 0xC0) == 0x80) {
      cp = (uint32_t(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F), i += 2;
    } else {
      out.resize(start);
      return false;
    }
    if (cp >= a.byte_of.size() || a.byte_of[cp] < 0) {
      out.resize(start);
      return false;
    }
    out.push_back(char(a.byte_of[cp]));
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) s += alphabet().chars[c];
  return s;
}

BytePairModel::BytePairModel(StringIdMap vocab,
                             const std::vector<std::pair<std::string, std::string>>& merges,
                             Options options)
    : vocab_(std::move(vocab)), opt_(std::move(options)) {
  for (int b = 0; b < 256; ++b) byte_id_[size_t(b)] = id_of(std::string(1, char(b)));
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    for (const std::string* part : {&a, &b})
      MT_CHECK_T(DataError, id_of(*part) >= 0,
                 "{}: merges entry {} (\"{} {}\") names \"{}\", which is not in the vocabulary",
                 opt_.source, r, bytes_to_byte_level(a), bytes_to_byte_level(b),
                 bytes_to_byte_level(*part));
    const int32_t merged = id_of(a + b);
    MT_CHECK_T(DataError, merged >= 0,
               "{}: merges entry {} (\"{} {}\") makes \"{}\", which is not in the vocabulary",
               opt_.source, r, bytes_to_byte_level(a), bytes_to_byte_level(b),
               bytes_to_byte_level(a + b));
    merges_.emplace(key(id_of(a), id_of(b)), Merge{int32_t(r), merged});  // first rank wins
  }
}

int32_t BytePairModel::id_of(std::string_view bytes) const {
  auto it = vocab_.find(bytes);
  return it == vocab_.end() ? -1 : it->second;
}

const BytePairModel::Merge* BytePairModel::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BytePairModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (opt_.ignore_merges && piece.size() > 1) {
    int32_t whole = id_of(piece);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<int32_t> ids, prev, next;
  thread_local std::vector<Cand> heap;
  const int32_t n = int32_t(piece.size());
  ids.resize(size_t(n)), prev.resize(size_t(n)), next.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    const auto byte = static_cast<unsigned char>(piece[size_t(i)]);
    int32_t id = byte_id_[byte] >= 0 ? byte_id_[byte] : opt_.unk_id;
    MT_CHECK_T(DataError, id >= 0,
               "{}: byte 0x{:02X} (byte-level character \"{}\") has no token in the vocabulary "
               "and the model has no unk_token",
               opt_.source, int(byte), byte_level_alphabet()[byte]);
    ids[size_t(i)] = id, prev[size_t(i)] = i - 1, next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  heap.clear();
  auto push = [&](int32_t pos, int32_t right) {
    if (const Merge* m = find_merge(ids[size_t(pos)], ids[size_t(right)])) {
      heap.push_back({m->rank, pos, ids[size_t(pos)], ids[size_t(right)], m->id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Cand c = heap.back();
    heap.pop_back();
    const int32_t r = next[size_t(c.pos)];
    if (ids[size_t(c.pos)] != c.left || r < 0 || ids[size_t(r)] != c.right) continue;  // stale
    ids[size_t(c.pos)] = c.merged;
    ids[size_t(r)] = -1;
    next[size_t(c.pos)] = next[size_t(r)];
    if (next[size_t(r)] >= 0) prev[size_t(next[size_t(r)])] = c.pos;
    if (prev[size_t(c.pos)] >= 0) push(prev[size_t(c.pos)], c.pos);
    if (next[size_t(c.pos)] >= 0) push(c.pos, next[size_t(c.pos)]);
  }
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(ids[size_t(i)]);
}

uint64_t PieceCache::hash_of(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t k;
    std::memcpy(&k, s.data() + i, 8);
    h = (h ^ k) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t k = 0;
  std::memcpy(&k, s.data() + i, s.size() - i);
  h ^= k;
  h = (h ^ (h >> 33)) * 0xFF51AFD7ED558CCDull;  // murmur3's finaliser: every bit mixes
  h = (h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return h == 0 ? 1 : h;  // 0 marks an empty slot
}

bool PieceCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  if (slots_.empty() || piece.size() > kMaxPieceBytes) return false;
  const uint64_t h = hash_of(piece);
  const size_t mask = slots_.size() - 1;
  for (size_t i = size_t(h) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == h && s.key_len == piece.size() &&
        std::memcmp(keys_.data() + s.key_at, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_at, ids_.begin() + s.ids_at + s.n_ids);
      return true;
    }
  }
}

void PieceCache::insert(std::string_view piece, std::span<const int32_t> ids) {
  if (piece.size() > kMaxPieceBytes || ids.size() > kMaxPieceBytes) return;
  if (slots_.empty()) slots_.resize(kMaxEntries * 2);  // load factor at most 1/2
  if (entries_ >= kMaxEntries) clear();
  const uint64_t h = hash_of(piece);
  const size_t mask = slots_.size() - 1;
  size_t i = size_t(h) & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = Slot{h, uint32_t(keys_.size()), uint32_t(ids_.size()), uint16_t(piece.size()),
                   uint16_t(ids.size())};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++entries_;
}

void PieceCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  entries_ = 0;
}

}  // namespace meshtrain
