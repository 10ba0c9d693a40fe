// Chunked parallel encoding on the process's worker pool (core/thread_pool.h). Chunks hold about
// 1 MB of text so two threads stay busy on small corpora and the per-chunk buffers stay small;
// the join copies each chunk once, then frees it.
#include "meshtrain/data/parallel_encode.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "meshtrain/core/progress.h"
#include "meshtrain/core/thread_pool.h"

namespace meshtrain {

int encode_threads(int requested, int local_ranks) {
  if (requested > 0) return requested;
  const int hw = std::max(1, int(std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, local_ranks));
}

EncodedCorpus encode_corpus(const Tokenizer& tokenizer, const TextCorpus& corpus, int threads,
                            Progress* progress) {
  constexpr int64_t kChunkBytes = int64_t(1) << 20;
  const int64_t n = corpus.num_documents();
  std::vector<int64_t> bounds{0};
  int64_t acc = 0;
  for (int64_t d = 0; d < n; ++d) {
    acc += int64_t(corpus.document(d).size()) + 1;
    if (acc >= kChunkBytes) bounds.push_back(d + 1), acc = 0;
  }
  if (bounds.back() != n) bounds.push_back(n);
  const size_t chunks = bounds.size() - 1;

  struct Chunk {
    std::vector<int32_t> tokens;
    std::vector<int64_t> lengths;
    std::exception_ptr error;
  };
  std::vector<Chunk> out(chunks);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (;;) {
      const size_t c = next.fetch_add(1);
      if (c >= chunks || failed.load()) return;
      Chunk& ch = out[c];
      try {
        int64_t bytes = 0;
        ch.lengths.reserve(size_t(bounds[c + 1] - bounds[c]));
        for (int64_t d = bounds[c]; d < bounds[c + 1]; ++d) {
          const std::string_view doc = corpus.document(d);
          const size_t before = ch.tokens.size();
          tokenizer.encode_into(doc, ch.tokens);
          ch.lengths.push_back(int64_t(ch.tokens.size() - before));
          bytes += int64_t(doc.size());
        }
        if (progress) progress->add(bytes);
      } catch (...) {
        ch.error = std::current_exception();
        failed.store(true);
      }
    }
  };
  run_on_threads(work, std::min<int>(threads, int(chunks)));
  for (const Chunk& ch : out)  // the first failing chunk in document order
    if (ch.error) std::rethrow_exception(ch.error);

  EncodedCorpus r;
  size_t total = 0;
  for (const Chunk& ch : out) total += ch.tokens.size();
  r.tokens.reserve(total);
  r.offsets.reserve(size_t(n) + 1);
  r.offsets.push_back(0);
  for (Chunk& ch : out) {
    r.tokens.insert(r.tokens.end(), ch.tokens.begin(), ch.tokens.end());
    for (int64_t len : ch.lengths) r.offsets.push_back(r.offsets.back() + len);
    std::vector<int32_t>().swap(ch.tokens);
  }
  return r;
}

}  // namespace meshtrain
