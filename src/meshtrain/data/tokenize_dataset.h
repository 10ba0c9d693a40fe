// `meshtrain tokenize`: a text dataset (fortunes, text, jsonl) to llm.c token files, read in
// batches of files so memory stays bounded by a batch, encoded on every core, written in document
// order as [BOS] doc [EOS]. uint16 tokens when the vocabulary fits, else llm.c's uint32 format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/text_dataset.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

struct TokenizeOptions {
  std::string dataset = "text";  // fortunes | text | jsonl
  std::string input;             // the dataset path ("" = the default folder for fortunes)
  std::string text_field = kDefaultTextField;
  // FILE.bin: one file. Anything else: a folder of shard_000000.bin, ... of shard_tokens each.
  std::string output;
  int threads = 0;  // 0 = all cores
  int64_t shard_tokens = 100'000'000;
  int64_t batch_bytes = int64_t(64) << 20;  // input files read per batch (at least one file)
};

struct TokenizeSummary {
  int64_t documents = 0, bytes = 0, tokens = 0;  // bytes: of the documents' text
  std::string input;                             // the dataset path read (defaults resolved)
  std::vector<std::string> files;                // written, in order
  TokenWidth width = TokenWidth::kU16;
  double seconds = 0;
  std::string describe(const TokenizeOptions& o) const;  // the command's closing line
};

// DataError for a dataset without documents; outputs already written are removed on any error.
TokenizeSummary tokenize_dataset(const Tokenizer& tokenizer, const TokenizeOptions& options);

}  // namespace meshtrain
