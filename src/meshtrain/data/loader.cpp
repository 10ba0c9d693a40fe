// TokenLoader: deterministic packing (per-epoch shuffle from seed and epoch only, never from the
// rank) and the global window numbering that makes every dp layout read the same rows.
// next() runs inside the step loop: it only reads and copies into buffers sized up front.
#include "meshtrain/data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "meshtrain/core/check.h"

namespace meshtrain {

DataSource open_data_source(const std::string& dataset, const std::string& path) {
  DataSource s;
  s.dataset = dataset;
  if (dataset == "fortunes") {
    s.corpus = std::make_shared<const TextCorpus>(TextCorpus::load_fortunes(path));
  } else if (dataset == "text") {
    s.corpus = std::make_shared<const TextCorpus>(TextCorpus::load_text(path));
  } else if (dataset == "tokens") {
    for (const std::string& f : list_token_files(path))
      s.token_files.push_back(std::make_shared<const TokenFile>(f));
  } else {
    MT_THROW(ConfigError, "[training] dataset must be one of fortunes, text, tokens, found \"{}\"",
             dataset);
  }
  return s;
}

namespace {

// splitmix64: a fixed, portable generator (std::shuffle's algorithm is unspecified, so the
// data order would differ between standard libraries).
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Unbiased integer in [0, n) (Lemire's multiply-and-reject).
uint64_t bounded(uint64_t& state, uint64_t n) {
  for (;;) {
    unsigned __int128 m = (unsigned __int128)splitmix64(state) * n;
    uint64_t low = uint64_t(m);
    if (low >= n || low >= (0 - n) % n) return uint64_t(m >> 64);
  }
}

}  // namespace

TokenLoader::TokenLoader(const DataSource& source, const Tokenizer& tokenizer, int64_t seq_len,
                         int64_t local_batch, int64_t dp_rank, int64_t dp_degree,
                         int64_t accum_steps, uint64_t seed)
    : seq_len_(seq_len),
      local_batch_(local_batch),
      dp_rank_(dp_rank),
      dp_degree_(dp_degree),
      accum_steps_(accum_steps),
      seed_(seed) {
  MT_CHECK_T(ValueError, seq_len >= 1, "loader: seq_len must be >= 1, found {}", seq_len);
  MT_CHECK_T(ValueError, local_batch >= 1, "loader: local batch must be >= 1, found {}",
             local_batch);
  MT_CHECK_T(ValueError, dp_degree >= 1 && dp_rank >= 0 && dp_rank < dp_degree,
             "loader: dp rank must be in [0, dp degree), found rank {} of {}", dp_rank, dp_degree);
  MT_CHECK_T(ValueError, accum_steps >= 1, "loader: accumulation steps must be >= 1, found {}",
             accum_steps);
  bos_ = tokenizer.bos_id(), eos_ = tokenizer.eos_id();
  if (source.corpus) {
    packed_ = true;
    const TextCorpus& c = *source.corpus;
    const int64_t n = c.num_documents();
    MT_CHECK_T(DataError, n > 0, "{} dataset '{}' has no documents", c.kind(), c.path());
    doc_offsets_.reserve(size_t(n) + 1);
    doc_offsets_.push_back(0);
    doc_tokens_.reserve(size_t(c.num_bytes()));
    for (int64_t d = 0; d < n; ++d) {
      std::vector<int32_t> ids = tokenizer.encode(c.document(d));
      doc_tokens_.insert(doc_tokens_.end(), ids.begin(), ids.end());
      doc_offsets_.push_back(int64_t(doc_tokens_.size()));
    }
    max_token_id_ = std::max(bos_, eos_);
    for (int32_t t : doc_tokens_) max_token_id_ = std::max(max_token_id_, t);
    tokens_per_epoch_ = int64_t(doc_tokens_.size()) + 2 * n;
    perm_.resize(size_t(n));
    slot_start_.resize(size_t(n) + 1);
    description_ =
        fmt::format("{}, {} tokens/epoch", c.description(), format_si(double(tokens_per_epoch_)));
  } else {
    MT_CHECK_T(DataError, !source.token_files.empty(), "{} dataset: no token files",
               source.dataset);
    files_ = source.token_files;
    file_start_.push_back(0);
    for (const auto& f : files_) {
      for (uint16_t t : f->tokens()) max_token_id_ = std::max<int32_t>(max_token_id_, t);
      file_start_.push_back(file_start_.back() + f->num_tokens());
    }
    tokens_per_epoch_ = file_start_.back();
    description_ = fmt::format("tokens: {} file{}, {} tokens/epoch (max id {})", files_.size(),
                               files_.size() == 1 ? "" : "s", format_si(double(tokens_per_epoch_)),
                               max_token_id_);
  }
  windows_per_epoch_ = tokens_per_epoch_ / (seq_len + 1);
  MT_CHECK_T(DataError, windows_per_epoch_ >= 1,
             "{} dataset: {} tokens per epoch, fewer than one window of seq_len + 1 = {} tokens; "
             "lower [training] seq_len or use more data",
             source.dataset, tokens_per_epoch_, seq_len + 1);
  window_.resize(size_t(seq_len) + 1);
  if (packed_) start_epoch(0);
}

void TokenLoader::start_epoch(int64_t epoch) {
  const size_t n = perm_.size();
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  uint64_t state = seed_ ^ (0x5851f42d4c957f2dull * uint64_t(epoch + 1));
  (void)splitmix64(state);
  for (size_t i = n; i > 1; --i) std::swap(perm_[i - 1], perm_[bounded(state, i)]);
  slot_start_[0] = 0;
  for (size_t k = 0; k < n; ++k) {
    int64_t d = perm_[k];
    slot_start_[k + 1] =
        slot_start_[k] + (doc_offsets_[size_t(d) + 1] - doc_offsets_[size_t(d)]) + 2;
  }
  epoch_ = epoch;
}

void TokenLoader::read_stream(int64_t pos, int64_t n, int32_t* out) const {
  if (packed_) {
    size_t slot = size_t(std::upper_bound(slot_start_.begin(), slot_start_.end(), pos) -
                         slot_start_.begin()) -
                  1;
    int64_t off = pos - slot_start_[slot];
    while (n > 0) {
      const size_t d = size_t(perm_[slot]);
      const int64_t len = doc_offsets_[d + 1] - doc_offsets_[d];
      const int32_t* doc = doc_tokens_.data() + doc_offsets_[d];
      if (off == 0) *out++ = bos_, --n, ++off;
      if (n > 0 && off <= len) {
        int64_t k = std::min(n, len + 1 - off);
        std::memcpy(out, doc + (off - 1), size_t(k) * sizeof(int32_t));
        out += k, n -= k, off += k;
      }
      if (n > 0 && off == len + 1) *out++ = eos_, --n, ++off;
      if (off == len + 2) ++slot, off = 0;
    }
    return;
  }
  size_t f =
      size_t(std::upper_bound(file_start_.begin(), file_start_.end(), pos) - file_start_.begin()) -
      1;
  int64_t off = pos - file_start_[f];
  while (n > 0) {
    std::span<const uint16_t> toks = files_[f]->tokens();
    int64_t k = std::min(n, int64_t(toks.size()) - off);
    for (int64_t i = 0; i < k; ++i) out[i] = int32_t(toks[size_t(off + i)]);
    out += k, n -= k;
    ++f, off = 0;
  }
}

int64_t TokenLoader::window_index(int64_t step, int64_t micro_batch, int64_t rank,
                                  int64_t row) const {
  const int64_t rows = dp_degree_ * local_batch_;  // one micro-batch of every rank
  return window_offset_ + step * (accum_steps_ * rows) + micro_batch * rows + rank * local_batch_ +
         row;
}

void TokenLoader::resume_at(int64_t step, int64_t window) {
  MT_CHECK_T(DataError, step >= 0 && window >= 0,
             "loader resume: expected step >= 0 and window >= 0, found step {} window {}", step,
             window);
  window_offset_ = 0;
  window_offset_ = window - window_index(step, 0, 0, 0);
  step_ = step, micro_ = 0;
}

void TokenLoader::next(int32_t* inputs, int32_t* labels) {
  const int64_t s = seq_len_;
  const int64_t base = window_index(step_, micro_, dp_rank_, 0);
  for (int64_t i = 0; i < local_batch_; ++i) {
    const int64_t j = base + i;
    const int64_t epoch = j / windows_per_epoch_;
    if (packed_ && epoch != epoch_) start_epoch(epoch);
    read_stream((j % windows_per_epoch_) * (s + 1), s + 1, window_.data());
    std::memcpy(inputs + i * s, window_.data(), size_t(s) * sizeof(int32_t));
    std::memcpy(labels + i * s, window_.data() + 1, size_t(s) * sizeof(int32_t));
  }
  if (++micro_ == accum_steps_) micro_ = 0, ++step_;
}

int64_t TokenLoader::epoch_of_next_window() const {
  return window_index(step_, micro_, dp_rank_, 0) / windows_per_epoch_;
}

TokenLoader::State TokenLoader::state() const {
  return State{step_, micro_, epoch_of_next_window(), window_offset_};
}

void TokenLoader::restore(const State& st) {
  MT_CHECK_T(DataError, st.step >= 0 && st.micro_batch >= 0 && st.micro_batch < accum_steps_,
             "loader state: expected step >= 0 and micro_batch in [0, {}), found step {} "
             "micro_batch {}",
             accum_steps_, st.step, st.micro_batch);
  const int64_t saved_offset = window_offset_;
  window_offset_ = st.window_offset;
  const int64_t epoch = window_index(st.step, st.micro_batch, dp_rank_, 0) / windows_per_epoch_;
  window_offset_ = saved_offset;
  MT_CHECK_T(DataError, epoch == st.epoch,
             "loader state: step {} is in epoch {} of this dataset, but the saved state says "
             "epoch {} (did the dataset, seq_len or batch size change since it was saved?)",
             st.step, epoch, st.epoch);
  step_ = st.step, micro_ = st.micro_batch, window_offset_ = st.window_offset;
}

}  // namespace meshtrain
