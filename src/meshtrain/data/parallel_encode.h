// Tokenizing a corpus on every core: documents are cut into contiguous chunks that worker threads
// take in turn; each chunk's ids land in its own slot and are joined in document order, so the
// result is the same for any number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/text_dataset.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

class Progress;

struct EncodedCorpus {
  std::vector<int32_t> tokens;   // every document's ids back to back (no BOS/EOS)
  std::vector<int64_t> offsets;  // n_docs + 1: document d is tokens[offsets[d], offsets[d + 1])
};

// Threads to use when a caller asks for `requested` (<= 0: all cores, shared by `local_ranks`
// processes on this host).
int encode_threads(int requested, int local_ranks = 1);

// Encodes every document of `corpus` with `threads` workers (see encode_threads). `progress`, when
// given, advances by each chunk's bytes. The first error a worker meets is rethrown here.
EncodedCorpus encode_corpus(const Tokenizer& tokenizer, const TextCorpus& corpus, int threads,
                            Progress* progress = nullptr);

}  // namespace meshtrain
