// Data as users keep it: JSON-lines files and folders (and each of their errors), llm.c's uint32
// token files, the tokenize command's work (one file or shards, same tokens), the loader without
// BOS/EOS, and the trainer with an HF tokenizer (its vocabulary, and ids past a fixed one).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/core/check.h"
#include "meshtrain/data/hf_tokenizer.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/tokenize_dataset.h"
#include "meshtrain/optim/param_store.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"
#include "tokenizer_fixture.h"

namespace meshtrain {
namespace {
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

template <typename F>
std::string data_error(F&& f) {
  return testing::error_message<DataError>(f);
}

class DataSources : public testing::TempDirTest {};

std::vector<std::string> docs_of(const TextCorpus& c) {
  std::vector<std::string> out;
  for (int64_t d = 0; d < c.num_documents(); ++d) out.emplace_back(c.document(d));
  return out;
}

// ---- JSON lines --------------------------------------------------------------------------------

TEST_F(DataSources, JsonlFileAndFolder) {
  const std::string f = write("one.jsonl",
                              "{\"text\": \"first doc\\nline two\", \"id\": 1}\n"
                              "\n"
                              "{\"id\": 2, \"text\": \"\"}\n"  // empty documents are skipped
                              "  {\"text\": \"caf\\u00e9 \\ud83c\\udf89\"}\r\n");
  TextCorpus c = TextCorpus::load_jsonl(f);
  EXPECT_EQ(docs_of(c), (std::vector<std::string>{"first doc\nline two", "café 🎉"}));
  EXPECT_EQ(c.kind(), "jsonl");
  // A folder: *.jsonl and *.json files, recursively, sorted by path; other files are ignored.
  write("d/b.jsonl", "{\"body\": \"b1\"}\n{\"body\": \"b2\"}\n");
  write("d/a/z.json", "{\"body\": \"a\"}\n");
  write("d/notes.txt", "not data");
  TextCorpus folder = TextCorpus::load_jsonl((dir_ / "d").string(), "body");
  EXPECT_EQ(docs_of(folder), (std::vector<std::string>{"a", "b1", "b2"}));
  EXPECT_EQ(folder.num_files(), 2);
  DataSource src = open_data_source("jsonl", (dir_ / "d").string(), "body");
  EXPECT_EQ(src.corpus->num_documents(), 3);
}

TEST_F(DataSources, JsonlErrorsNameFileAndLine) {
  const std::string bad = write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(bad); }),
                  "jsonl dataset: '" + bad + "' line 2 is not JSON");
  const std::string nofield =
      write("nofield.jsonl", "{\"text\": \"a\"}\n\n{\"body\": \"x\", \"id\": 3}\n");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(nofield); }),
                  "'" + nofield +
                      "' line 3 has no \"text\" field (its fields: body, id); set "
                      "[training] dataset_text_field");
  const std::string number = write("number.jsonl", "{\"text\": 12}\n");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(number); }),
                  "line 1: field \"text\" is a number, expected a string");
  const std::string array = write("array.jsonl", "[\"text\"]\n");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(array); }),
                  "line 1 is a JSON array, expected an object with a \"text\" field");
  // A pretty-printed .json file is not JSON lines.
  const std::string pretty = write("p/pretty.json", "{\n  \"text\": \"x\"\n}\n");
  const std::string msg = data_error([&] { TextCorpus::load_jsonl((dir_ / "p").string()); });
  EXPECT_CONTAINS(msg, "'" + pretty + "' line 1 is not JSON");
  EXPECT_CONTAINS(msg, "must be JSON lines: one object per line");
  // Empty datasets and folders.
  const std::string blank = write("blank.jsonl", "\n  \n{\"text\": \"\"}\n");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(blank); }),
                  "jsonl dataset: no documents in '" + blank + "' (1 file;");
  fs::create_directories(dir_ / "none");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl((dir_ / "none").string()); }),
                  "no *.jsonl or *.json files under folder");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_jsonl(""); }),
                  "jsonl dataset needs [training] dataset_path");
}

// ---- uint32 token files ------------------------------------------------------------------------

TEST_F(DataSources, Uint32TokenFilesRoundTripAndLoad) {
  EXPECT_EQ(token_width_for(65536), TokenWidth::kU16);
  EXPECT_EQ(token_width_for(65537), TokenWidth::kU32);
  const Ids toks{0, 70000, 128255, 5, 65536, 9, 1, 2, 3, 4, 5};
  const std::string p = (dir_ / "big.bin").string();
  {
    TokenFileWriter w(p, TokenWidth::kU32);  // streamed in two parts
    w.append(std::span<const int32_t>(toks).first(4));
    w.append(std::span<const int32_t>(toks).subspan(4));
    w.close();
  }
  EXPECT_EQ(int64_t(fs::file_size(p)), 1024 + 4 * int64_t(toks.size()));
  int32_t h[3];
  std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], int32_t(toks.size()));
  TokenFile f(p);
  EXPECT_EQ(f.width(), TokenWidth::kU32);
  EXPECT_EQ(f.max_token(), 128255);
  Ids back(toks.size());
  f.read(0, int64_t(toks.size()), back.data());
  EXPECT_EQ(back, toks);
  // The loader reads it like a uint16 file and reports where the largest id comes from.
  TokenLoader l(open_data_source("tokens", p), ByteTokenizer(), 4, 1, 0, 1, 1, 0);
  EXPECT_EQ(l.max_token_id(), 128255);
  EXPECT_EQ(l.max_token_source(), p);
  Ids in(4), lab(4);
  l.next(in.data(), lab.data());
  EXPECT_EQ(in, (Ids{0, 70000, 128255, 5}));
  EXPECT_EQ(lab, (Ids{70000, 128255, 5, 65536}));
  // uint16 files refuse such ids, naming the way out.
  EXPECT_CONTAINS(data_error([&] { write_token_file((dir_ / "x.bin").string(), toks); }),
                  "found token id 70000 at position 1 (ids past 65,535 need llm.c's uint32 "
                  "format, version 7)");
  EXPECT_FALSE(fs::exists(dir_ / "x.bin"));
  // A uint32 magic with the uint16 version is refused.
  std::ifstream file(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), {});
  const int32_t v1 = 1;
  std::memcpy(bytes.data() + 4, &v1, 4);
  const std::string wrong = write("wrong.bin", bytes);
  EXPECT_CONTAINS(data_error([&] { TokenFile t(wrong); }),
                  "unsupported version, expected 7 (uint32 tokens) with magic 20240801, found 1");
}

// ---- the tokenize command ----------------------------------------------------------------------

TEST_F(DataSources, TokenizeJsonlToOneFileOrShards) {
  testing::TokenizerSpec s;
  s.merges = {{"d", "o"}, {"do", "c"}};  // do 256, doc 257
  s.added = {{"<s>", 70000}, {"</s>", 70001}};
  s.bos_token = "<s>";
  s.eos_token = "</s>";
  auto tok = HfTokenizer::load(testing::write_tokenizer_folder((dir_ / "tok").string(), s));
  write("data/a.jsonl", "{\"text\": \"doc a\"}\n{\"text\": \"doc\"}\n");
  write("data/b.jsonl", "{\"text\": \"b doc\"}\n");
  TokenizeOptions o;
  o.dataset = "jsonl";
  o.input = (dir_ / "data").string();
  o.output = (dir_ / "all.bin").string();
  o.batch_bytes = 1;  // one file per batch
  TokenizeSummary sum = tokenize_dataset(*tok, o);
  const Ids expected{70000, 257, ' ', 'a', 70001, 70000, 257, 70001, 70000, 'b', ' ', 257, 70001};
  EXPECT_EQ(sum.documents, 3);
  EXPECT_EQ(sum.tokens, int64_t(expected.size()));
  EXPECT_EQ(sum.width, TokenWidth::kU32);
  ASSERT_EQ(sum.files, (std::vector<std::string>{o.output}));
  TokenFile one(o.output);
  Ids got(size_t(one.num_tokens()));
  one.read(0, one.num_tokens(), got.data());
  EXPECT_EQ(got, expected);
  EXPECT_CONTAINS(sum.describe(o), "3 documents");
  EXPECT_CONTAINS(sum.describe(o), "13 tokens in 1 file (uint32 tokens, llm.c version 7)");
  // Shards of 5 tokens: the same stream, cut every 5 tokens.
  o.output = (dir_ / "shards").string();
  o.shard_tokens = 5;
  o.threads = 2;
  sum = tokenize_dataset(*tok, o);
  ASSERT_EQ(sum.files.size(), 3u);
  EXPECT_EQ(fs::path(sum.files[2]).filename(), "shard_000002.bin");
  Ids joined;
  for (const std::string& f : list_token_files(o.output)) {
    TokenFile t(f);
    Ids part(size_t(t.num_tokens()));
    t.read(0, t.num_tokens(), part.data());
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, expected);
  // An empty dataset is an error and leaves no output behind.
  write("empty/e.jsonl", "\n{\"text\": \"\"}\n");
  o.input = (dir_ / "empty").string();
  o.output = (dir_ / "empty.bin").string();
  EXPECT_CONTAINS(data_error([&] { tokenize_dataset(*tok, o); }),
                  "jsonl dataset '" + o.input + "': no documents to tokenize in 1 file");
  EXPECT_FALSE(fs::exists(o.output));
}

// ---- loader without BOS/EOS ------------------------------------------------------------------

TEST_F(DataSources, LoaderPacksWithoutBosEosWhenTheTokenizerHasNone) {
  std::vector<std::string> docs{"abc", "defg", "hijkl", "mnopqr", "stuvwxy", "zABCDEFG", "HIJ"};
  DataSource src;
  src.dataset = "text";
  src.corpus = std::make_shared<const TextCorpus>(TextCorpus::from_documents("text", "mem", docs));
  auto bare = HfTokenizer::load(testing::write_tokenizer_folder((dir_ / "t").string(), {}));
  ASSERT_EQ(bare->bos_id(), -1);
  TokenLoader plain(src, *bare, 4, 1, 0, 1, 1, 3);
  EXPECT_EQ(plain.tokens_per_epoch(), 36);
  EXPECT_EQ(plain.windows_per_epoch(), 7);
  // Same seed, same document order as with the byte tokenizer's BOS/EOS framing.
  TokenLoader framed(src, ByteTokenizer(), 9, 1, 0, 1, 1, 3);
  Ids stream, in(9), lab(9);
  for (int w = 0; w < 5; ++w) {
    framed.next(in.data(), lab.data());
    stream.insert(stream.end(), in.begin(), in.end());
    stream.push_back(lab.back());
  }
  std::erase_if(stream, [](int32_t t) { return t >= 256; });
  Ids got, pin(4), plab(4);
  for (int w = 0; w < 7; ++w) {
    plain.next(pin.data(), plab.data());
    got.insert(got.end(), pin.begin(), pin.end());
    got.push_back(plab.back());
  }
  EXPECT_EQ(got, Ids(stream.begin(), stream.begin() + 35));
}

// ---- the trainer with an HF tokenizer ----------------------------------------------------------

TEST_F(DataSources, TrainerTakesTheVocabularyFromTheTokenizer) {
  testing::TokenizerSpec s;
  s.merges = {{"t", "h"}, {"th", "e"}, {" ", "the"}};
  s.added = {{"<|begin_of_text|>", 300}, {"<|end_of_text|>", 301}};
  s.bos_token = "<|begin_of_text|>";
  s.eos_token = "<|end_of_text|>";
  const std::string folder = testing::write_tokenizer_folder((dir_ / "tok").string(), s);
  Trainer t(testing::tiny_job({"--model.hf_assets_path", folder, "--training.steps", "2"}),
            testing::test_runtime());
  EXPECT_EQ(t.params().master("tok_embeddings.weight").shape()[0], 302);
  EXPECT_TRUE(std::isfinite(t.step().loss));
  // A fixed vocabulary that the tokenizer's ids do not fit in names the id, the size and the file.
  const std::string msg = testing::error_message<ConfigError>([&] {
    Trainer small(
        testing::tiny_job({"--model.hf_assets_path", folder, "--model.vocab_size", "280"}),
        testing::test_runtime());
  });
  EXPECT_CONTAINS(msg,
                  "has vocab_size 280 but token id 301 occurs in " + folder + "/tokenizer.json");
  // The same for token files: the file holding the id is named.
  const std::string bin = (dir_ / "big.bin").string();
  std::vector<int32_t> toks(200, 7);
  toks[50] = 4000;
  write_token_file(bin, toks);
  const std::string msg2 = testing::error_message<ConfigError>([&] {
    Trainer small(testing::tiny_job({"--training.dataset", "tokens", "--training.dataset_path", bin,
                                     "--model.vocab_size", "1000"}),
                  testing::test_runtime());
  });
  EXPECT_CONTAINS(msg2, "has vocab_size 1000 but token id 4000 occurs in " + bin);
}

}  // namespace
}  // namespace meshtrain
