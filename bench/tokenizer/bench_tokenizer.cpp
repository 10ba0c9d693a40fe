// bench_tokenizer: MB/s of text through HfTokenizer (added-token scan, pre-tokenizer, BPE) via
// encode_corpus, on one thread and on all cores; median of --reps passes after one warm-up pass
// (the warm-up fills the per-thread piece caches, as a long tokenizing job does).
//
// Tokenizers: built here on the fly, byte-level BPE whose merges spell the --words most frequent
// pieces of the corpus (about two merges per word), 256 reserved special tokens as in Llama-3,
// with (a) Llama-3's pre-tokenizer and ignore_merges, (b) DeepSeek-V3's three splits; or a real
// tokenizer folder with --hf-assets. Corpus: the fortunes corpus, or --dataset/--input.
//
//   build/bench/tokenizer/bench_tokenizer [--words 20000] [--reps 5] [--hf-assets DIR]
//                                         [--dataset jsonl --input PATH] [--save DIR]
// --save keeps the built tokenizer folders (DIR/llama3-style, DIR/deepseek_v3-style).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/data/hf_tokenizer.h"
#include "meshtrain/data/parallel_encode.h"
#include "meshtrain/data/text_dataset.h"
#include "tokenizer_fixture.h"

using namespace meshtrain;

namespace {

struct Row {
  std::string name;
  int threads;
  double mb_s_first, mb_s_median, mb_per_cpu_s, tokens_per_byte;
};

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

Row measure(const std::string& name, const Tokenizer& tok, const TextCorpus& c, int threads,
            int reps) {
  double cpu = 0;
  auto pass = [&](size_t* tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    EncodedCorpus e = encode_corpus(tok, c, threads);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu = cpu_seconds() - c0;
    *tokens = e.tokens.size();
    return double(c.num_bytes()) / 1e6 / s;
  };
  size_t tokens = 0;
  const double first = pass(&tokens);
  std::vector<std::pair<double, double>> r;  // (MB/s, MB per CPU-second)
  for (int i = 0; i < reps; ++i) {
    double mb_s = pass(&tokens);
    r.emplace_back(mb_s, double(c.num_bytes()) / 1e6 / cpu);
  }
  std::sort(r.begin(), r.end());
  return {name,
          threads,
          first,
          r[r.size() / 2].first,
          r[r.size() / 2].second,
          double(tokens) / double(c.num_bytes())};
}

}  // namespace

int main(int argc, char** argv) {
  int words = 20000, reps = 5;
  std::string hf_assets, dataset = "fortunes", input, save;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--words")
      words = std::stoi(v);
    else if (k == "--reps")
      reps = std::max(1, std::stoi(v));
    else if (k == "--hf-assets")
      hf_assets = v;
    else if (k == "--dataset")
      dataset = v;
    else if (k == "--input")
      input = v;
    else if (k == "--save")
      save = v;
    else {
      std::fprintf(stderr, "bench_tokenizer: unknown option %s\n", k.c_str());
      return 1;
    }
  }
  const TextCorpus corpus = TextCorpus::load(dataset, input);
  const int all = encode_threads(0);
  std::printf("corpus: %s; %d hardware threads\n", corpus.description().c_str(), all);

  std::vector<std::pair<std::string, std::unique_ptr<HfTokenizer>>> toks;
  const auto dir = save.empty() ? std::filesystem::temp_directory_path() / "mt_bench_tokenizer"
                                : std::filesystem::path(save);
  if (!hf_assets.empty()) {
    toks.emplace_back("given", HfTokenizer::load(hf_assets));
  } else {
    std::vector<std::string_view> docs;
    for (int64_t d = 0; d < corpus.num_documents(); ++d) docs.push_back(corpus.document(d));
    for (int variant = 0; variant < 2; ++variant) {
      testing::TokenizerSpec s;
      s.pre_tokenizer =
          variant == 0 ? testing::llama3_pre_tokenizer() : testing::deepseek_v3_pre_tokenizer();
      s.ignore_merges = variant == 0;
      s.merges = testing::frequent_word_merges(docs, s.pre_tokenizer, words);
      const int first_special = 256 + int(s.merges.size());
      for (int k = 0; k < 256; ++k)
        s.added.push_back(
            {"<|reserved_special_token_" + std::to_string(k) + "|>", first_special + k});
      s.bos_token = s.added[0].content;
      s.eos_token = s.added[1].content;
      const std::string name = variant == 0 ? "llama3-style" : "deepseek_v3-style";
      toks.emplace_back(
          name, HfTokenizer::load(testing::write_tokenizer_folder((dir / name).string(), s)));
    }
  }
  for (auto& [name, t] : toks) std::printf("%s: %s\n", name.c_str(), t->name().c_str());

  std::printf(
      "\n| tokenizer | threads | MB/s (first pass) | MB/s (median of %d) | MB per CPU-second | "
      "tokens/byte |\n",
      reps);
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (auto& [name, t] : toks)
    for (int threads : {1, all}) {
      Row r = measure(name, *t, corpus, threads, reps);
      std::printf("| %s | %d | %.2f | %.2f | %.2f | %.3f |\n", r.name.c_str(), r.threads,
                  r.mb_s_first, r.mb_s_median, r.mb_per_cpu_s, r.tokens_per_byte);
      if (all == 1) break;
    }
  if (save.empty()) std::filesystem::remove_all(dir);
  return 0;
}
