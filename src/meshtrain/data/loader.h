// The data-parallel, stateful token loader. The j-th window of a run (seq_len + 1 tokens, no
// overlap) is the same whatever the rank layout: step t, micro-batch m, dp rank r, row i reads
// window t*(A*D*L) + m*(D*L) + r*L + i (+ an offset set on resume), so D ranks of L rows see one
// rank of D*L rows, row for row. A resumed run continues at the first window not yet read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/text_dataset.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

// What a loader reads: documents to tokenize and pack ("fortunes", "text"), or pre-tokenized
// files read as one stream ("tokens").
struct DataSource {
  std::string dataset;                                        // "fortunes" | "text" | "tokens"
  std::shared_ptr<const TextCorpus> corpus;                   // fortunes, text
  std::vector<std::shared_ptr<const TokenFile>> token_files;  // tokens, in sorted order
};

// `path` "" = the dataset's default location (fortunes: /usr/share/games/fortunes).
DataSource open_data_source(const std::string& dataset, const std::string& path);

class TokenLoader {
 public:
  struct State {
    int64_t step = 0;           // training steps fully consumed
    int64_t micro_batch = 0;    // micro-batches of the current step already consumed
    int64_t epoch = 0;          // epoch of the next window (a check when restoring)
    int64_t window_offset = 0;  // added to every window index (set by resume_at)
  };

  // Text sources are tokenized here, once. accum_steps = A micro-batches per step.
  TokenLoader(const DataSource& source, const Tokenizer& tokenizer, int64_t seq_len,
              int64_t local_batch, int64_t dp_rank, int64_t dp_degree, int64_t accum_steps,
              uint64_t seed);

  // Fills inputs and labels, each [local_batch, seq_len] row-major, for this rank's next
  // micro-batch: labels are inputs shifted by one token. Allocates nothing.
  void next(int32_t* inputs, int32_t* labels);

  State state() const;
  void restore(const State& s);  // DataError if the state cannot belong to this data/config

  // The global window the next micro-batch starts at (its dp rank 0, row 0): the run's position.
  int64_t next_window() const { return window_index(step_, micro_, 0, 0); }
  // Resumes so that step `step`, micro-batch 0, starts at global window `window`; later steps
  // follow this loader's layout (A, D, L). A checkpoint's next_window() resumed on any layout of
  // the same global batch reads exactly the windows of the uninterrupted run.
  void resume_at(int64_t step, int64_t window);

  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  int64_t windows_per_epoch() const { return windows_per_epoch_; }
  int32_t max_token_id() const { return max_token_id_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t local_batch() const { return local_batch_; }
  // "fortunes: 15,234 documents, 2.54 MB, 2.61M tokens/epoch"
  const std::string& description() const { return description_; }

  // The window a given (step, micro-batch, rank, row) reads; exposed for tests and logs.
  int64_t window_index(int64_t step, int64_t micro_batch, int64_t rank, int64_t row) const;

 private:
  void start_epoch(int64_t epoch);  // reshuffles in place, no allocation
  void read_stream(int64_t pos, int64_t n, int32_t* out) const;
  int64_t epoch_of_next_window() const;

  bool packed_ = false;  // text: BOS doc EOS per document, shuffled per epoch
  int64_t seq_len_, local_batch_, dp_rank_, dp_degree_, accum_steps_;
  uint64_t seed_;
  int32_t bos_ = 0, eos_ = 0, max_token_id_ = 0;
  int64_t tokens_per_epoch_ = 0, windows_per_epoch_ = 0;
  std::string description_;

  // Packed text: all documents' tokens back to back (without BOS/EOS) and where each starts.
  std::vector<int32_t> doc_tokens_;
  std::vector<int64_t> doc_offsets_;  // n_docs + 1
  // This epoch's order and the stream offset of each slot (n_docs + 1; slot k holds
  // BOS + doc perm_[k] + EOS). Sized at construction and rewritten in place per epoch.
  std::vector<int64_t> perm_, slot_start_;
  int64_t epoch_ = -1;

  // Token files: the stream is their concatenation; file_start_[f] = stream offset of file f.
  std::vector<std::shared_ptr<const TokenFile>> files_;
  std::vector<int64_t> file_start_;

  std::vector<int32_t> window_;  // seq_len + 1 tokens, reused by every next()
  int64_t step_ = 0, micro_ = 0, window_offset_ = 0;
};

}  // namespace meshtrain
