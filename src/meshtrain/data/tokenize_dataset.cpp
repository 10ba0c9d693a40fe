// The tokenize command's work: batches of input files -> parallel encode -> a token file writer
// that starts a new shard every shard_tokens tokens (a document may continue in the next shard,
// as llm.c's shards do). Progress counts input-file bytes.
#include "meshtrain/data/tokenize_dataset.h"

#include <chrono>
#include <filesystem>
#include <memory>

#include "meshtrain/core/check.h"
#include "meshtrain/core/progress.h"
#include "meshtrain/data/parallel_encode.h"

namespace meshtrain {
namespace fs = std::filesystem;

namespace {

bool ends_with_bin(const std::string& p) {
  return p.size() >= 4 && p.compare(p.size() - 4, 4, ".bin") == 0;
}

class ShardedWriter {
 public:
  ShardedWriter(const TokenizeOptions& o, TokenWidth w, std::vector<std::string>& files)
      : o_(o), width_(w), files_(files) {
    MT_CHECK_T(ValueError, o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX,
               "tokenize: tokens per shard must be in [1, 2^31 - 1], found {}", o.shard_tokens);
    if (!ends_with_bin(o.output)) {
      std::error_code ec;
      fs::create_directories(o.output, ec);
      MT_CHECK_T(IoError, !ec, "tokenize: cannot create output folder '{}': {}", o.output,
                 ec.message());
    }
  }
  void append(std::span<const int32_t> t) {
    const bool single = ends_with_bin(o_.output);
    while (!t.empty()) {
      if (!w_) open();
      const int64_t room = single ? int64_t(t.size()) : o_.shard_tokens - w_->num_tokens();
      const size_t k = size_t(std::min<int64_t>(room, int64_t(t.size())));
      w_->append(t.first(k));
      t = t.subspan(k);
      if (!single && w_->num_tokens() == o_.shard_tokens) w_->close(), w_.reset();
    }
  }
  void close() {
    if (!w_ && files_.empty()) open();  // an empty dataset never gets here; keep one file anyway
    if (w_) w_->close(), w_.reset();
  }

 private:
  void open() {
    const std::string p =
        ends_with_bin(o_.output)
            ? o_.output
            : (fs::path(o_.output) / fmt::format("shard_{:06}.bin", files_.size())).string();
    files_.push_back(p);
    w_ = std::make_unique<TokenFileWriter>(p, width_);
  }
  const TokenizeOptions& o_;
  TokenWidth width_;
  std::vector<std::string>& files_;
  std::unique_ptr<TokenFileWriter> w_;
};

}  // namespace

TokenizeSummary tokenize_dataset(const Tokenizer& tok, const TokenizeOptions& options) {
  TokenizeOptions o = options;
  if (o.dataset == "fortunes" && o.input.empty()) o.input = kDefaultFortunesDir;
  MT_CHECK_T(ValueError, !o.output.empty(), "tokenize needs an output (FILE.bin or a folder)");
  MT_CHECK_T(ValueError, o.dataset == "fortunes" || o.dataset == "text" || o.dataset == "jsonl",
             "tokenize reads a fortunes, text or jsonl dataset, found '{}'", o.dataset);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> inputs = dataset_files(o.dataset, o.input);
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const std::string& f : inputs) {
    std::error_code ec;
    sizes.push_back(int64_t(fs::file_size(f, ec)));
    total += sizes.back();
  }
  TokenizeSummary s;
  s.input = o.input;
  s.width = token_width_for(tok.vocab_size());
  const int threads = encode_threads(o.threads);
  try {
    ShardedWriter out(o, s.width, s.files);
    Progress progress(fmt::format("tokenizing {} '{}'", o.dataset, o.input), total,
                      ProgressOptions{.unit = ProgressUnit::kBytes, .enabled = 1});
    const int32_t bos = tok.bos_id(), eos = tok.eos_id();
    for (size_t first = 0; first < inputs.size();) {
      size_t last = first;
      int64_t batch = 0;
      while (last < inputs.size() && (last == first || batch + sizes[last] <= o.batch_bytes))
        batch += sizes[last++];
      const std::span<const std::string> files(inputs.data() + first, last - first);
      const TextCorpus c = TextCorpus::load_files(o.dataset, o.input, files, o.text_field);
      EncodedCorpus e = encode_corpus(tok, c, threads, &progress);
      progress.add(batch - c.num_bytes());  // the files' bytes that are not document text
      for (int64_t d = 0; d < c.num_documents(); ++d) {
        if (bos >= 0) out.append(std::span<const int32_t>(&bos, 1));
        out.append(std::span<const int32_t>(e.tokens).subspan(
            size_t(e.offsets[size_t(d)]), size_t(e.offsets[size_t(d) + 1] - e.offsets[size_t(d)])));
        if (eos >= 0) out.append(std::span<const int32_t>(&eos, 1));
      }
      s.documents += c.num_documents(), s.bytes += c.num_bytes();
      s.tokens += int64_t(e.tokens.size()) + c.num_documents() * ((bos >= 0) + (eos >= 0));
      first = last;
    }
    MT_CHECK_T(DataError, s.documents > 0, "{} dataset '{}': no documents to tokenize in {} file{}",
               o.dataset, o.input, inputs.size(), inputs.size() == 1 ? "" : "s");
    out.close();
  } catch (...) {
    std::error_code ec;
    for (const std::string& f : s.files) fs::remove(f, ec);
    throw;
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

std::string TokenizeSummary::describe(const TokenizeOptions& o) const {
  const bool u16 = width == TokenWidth::kU16;
  return fmt::format(
      "{} '{}': {} documents, {} -> {}: {} tokens in {} file{} ({} tokens, llm.c version {}), "
      "{:.1f}s ({:.2f} MB/s)",
      o.dataset, input, format_thousands(documents), format_bytes(bytes), o.output,
      format_thousands(tokens), files.size(), files.size() == 1 ? "" : "s",
      u16 ? "uint16" : "uint32", u16 ? kTokenFileVersion : kTokenFileVersionU32, seconds,
      seconds > 0 ? double(bytes) / 1e6 / seconds : 0.0);
}

}  // namespace meshtrain
