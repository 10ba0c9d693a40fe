// Data tests: byte tokenizer, fortune/text parsing, llm.c token files (round trip and every
// header error), and the loader's contract: shift, packing, seeds, epochs, dp-sharding identity,
// checkpoint state and no allocation in next().
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "meshtrain/core/check.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/text_dataset.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/tensor/allocator.h"
#include "test_support.h"

namespace meshtrain {
namespace {
namespace fs = std::filesystem;

template <typename F>
std::string data_error(F&& f) {
  return testing::error_message<DataError>(f);
}

class DataTest : public testing::TempDirTest {};

// ---- tokenizer -------------------------------------------------------------------------------

TEST(DataTokenizer, ByteRoundTripAndSpecials) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  all += "héllo wörld €";
  std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{256, 'h', 'i', 257}), "hi");  // specials dropped
  EXPECT_CONTAINS(data_error([&] {
                    tok.decode(std::vector<int32_t>{'a', 300});
                  }),
                  "token id at position 1 must be in [0, 258), found 300");
  EXPECT_CONTAINS(data_error([&] { make_tokenizer("gpt2"); }), "unknown tokenizer 'gpt2'");
}

// ---- text corpora ----------------------------------------------------------------------------

TEST(DataText, SplitFortunesAndParagraphs) {
  auto f = split_fortunes("a\nb\n%\nc 50% off\n%\n  \n%\nd");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "a\nb\n");
  EXPECT_EQ(f[1], "c 50% off\n");  // a % inside a line is text
  EXPECT_EQ(f[2], "d");
  EXPECT_EQ(split_fortunes("%\r\nx\r\n%\r\n").size(), 1u);
  auto p = split_paragraphs("\n\none\ntwo\n\n \t\nthree\n");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "one\ntwo\n");
  EXPECT_EQ(p[1], "three\n");
}

TEST(DataText, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);
  EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2);        // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0);      // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("x\xE2\x82"), 1);         // truncated
  EXPECT_EQ(find_invalid_utf8("xy\x80"), 2);            // stray continuation byte
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);  // past U+10FFFF
}

TEST_F(DataTest, FortunesFolderRulesAndOrder) {
  write("beta", "third\n%\n");
  write("alpha", "first\nline two\n%\nsecond\n");
  write("alpha.dat", std::string("\0\0\0\x02garbage", 11));
  write("off/gamma", "offensive\n%\n");
  write("notes.txt", "has an extension\n");
  fs::create_symlink(dir_ / "alpha", dir_ / "alpha.u8");
  fs::create_symlink(dir_ / "alpha", dir_ / "zlink");  // same file again: read once
  TextCorpus c = TextCorpus::load_fortunes(dir_.string());
  ASSERT_EQ(c.num_documents(), 3);
  EXPECT_EQ(c.num_files(), 2);
  EXPECT_EQ(c.document(0), "first\nline two\n");
  EXPECT_EQ(c.document(1), "second\n");
  EXPECT_EQ(c.document(2), "third\n");
  EXPECT_EQ(c.num_bytes(), 15 + 7 + 6);
  EXPECT_EQ(c.description(), "fortunes: 3 documents, 28 B");
}

TEST_F(DataTest, FortunesMissingFolderSaysHowToInstall) {
  std::string missing = (dir_ / "nope").string();
  std::string msg = data_error([&] { TextCorpus::load_fortunes(missing); });
  EXPECT_CONTAINS(msg, "'" + missing + "' not found");
  EXPECT_CONTAINS(msg, "scripts/install_deps.sh");
  EXPECT_CONTAINS(msg, "`fortunes`");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_fortunes(dir_.string()); }),
                  "no fortune files");
}

TEST(DataText, InstalledFortunesCorpus) {
  TextCorpus c = TextCorpus::load_fortunes("");
  EXPECT_GT(c.num_documents(), 1000);
  EXPECT_GT(c.num_files(), 10);
  EXPECT_GT(c.num_bytes(), 1'000'000);
  for (int64_t i = 0; i < c.num_documents(); i += 97)
    EXPECT_NE(c.document(i).find_first_not_of(" \t\r\n"), std::string_view::npos);
}

TEST_F(DataTest, TextFileAndFolder) {
  std::string file = write("one.txt", "p1 a\np1 b\n\n\np2\n");
  TextCorpus c = TextCorpus::load_text(file);
  ASSERT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.document(0), "p1 a\np1 b\n");
  write("sub/b.txt", "from b\n");
  write("a.txt", "from a");
  write("c.md", "not a txt file\n");
  TextCorpus f = TextCorpus::load_text(dir_.string());
  ASSERT_EQ(f.num_documents(), 4);  // a.txt, one.txt (2), sub/b.txt in path order
  EXPECT_EQ(f.document(0), "from a");
  EXPECT_EQ(f.document(3), "from b\n");
  EXPECT_EQ(f.num_files(), 3);
  std::string bad = write("bin/x.txt", "ok\xFF\xFEno");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_text(bad); }),
                  "'" + bad + "' is not valid UTF-8 (byte offset 2)");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_text((dir_ / "missing").string()); }),
                  "not found");
  EXPECT_CONTAINS(data_error([&] { TextCorpus::load_text(""); }), "needs [training] dataset_path");
}

// ---- token files -----------------------------------------------------------------------------

TEST_F(DataTest, TokenFileRoundTripAndHeader) {
  std::vector<int32_t> toks{0, 1, 2, 65535, 258, 42};
  std::string p = (dir_ / "t.bin").string();
  write_token_file(p, toks);
  EXPECT_EQ(int64_t(fs::file_size(p)), 1024 + 2 * 6);
  {
    std::ifstream in(p, std::ios::binary);
    int32_t h[3];
    in.read(reinterpret_cast<char*>(h), sizeof(h));
    EXPECT_EQ(h[0], 20240520);
    EXPECT_EQ(h[1], 1);
    EXPECT_EQ(h[2], 6);
  }
  TokenFile f(p);
  ASSERT_EQ(f.num_tokens(), 6);
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(f.token(int64_t(i)), toks[i]);
  TokenFile moved = std::move(f);
  EXPECT_EQ(moved.num_tokens(), 6);
  EXPECT_EQ(f.num_tokens(), 0);
  std::string empty = (dir_ / "e.bin").string();
  write_token_file(empty, {});
  EXPECT_EQ(TokenFile(empty).num_tokens(), 0);
  EXPECT_CONTAINS(data_error([&] {
                    write_token_file(p, std::vector<int32_t>{5, 70000});
                  }),
                  "found token id 70000 at position 1");
}

TEST_F(DataTest, TokenFileCorruptedHeaders) {
  std::string good = (dir_ / "good.bin").string();
  write_token_file(good, std::vector<int32_t>{1, 2, 3, 4});
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto patched = [&](const std::string& name, int at, int32_t value) {
    std::string b = bytes;
    std::memcpy(b.data() + at * 4, &value, 4);
    return write(name, b);
  };
  std::string magic = patched("magic.bin", 0, 12345);
  EXPECT_CONTAINS(data_error([&] { TokenFile t(magic); }),
                  "token file '" + magic +
                      "': bad magic number, expected 20240520 (uint16 tokens) or 20240801 (uint32 "
                      "tokens), found 12345");
  std::string version = patched("version.bin", 1, 2);
  EXPECT_CONTAINS(data_error([&] { TokenFile t(version); }), "unsupported version, expected 1");
  std::string count = patched("count.bin", 2, 5);
  EXPECT_CONTAINS(data_error([&] { TokenFile t(count); }),
                  "header says 5 tokens (1034 bytes with the header), found a file of 1032 bytes");
  std::string truncated = write("trunc.bin", bytes.substr(0, bytes.size() - 1));
  EXPECT_CONTAINS(data_error([&] { TokenFile t(truncated); }), "truncated or corrupted");
  std::string tiny = write("tiny.bin", bytes.substr(0, 100));
  EXPECT_CONTAINS(data_error([&] { TokenFile t(tiny); }),
                  "has 100 bytes, fewer than its 1024-byte header");
  std::string missing = (dir_ / "missing.bin").string();
  EXPECT_CONTAINS(data_error([&] { TokenFile t(missing); }),
                  "token file '" + missing + "' cannot be opened");
}

// A file that changes under a run is an error naming it and the byte offset: truncated (never
// zeros or a SIGBUS), modified in place, replaced by a rename, deleted. Both widths read exactly.
TEST_F(DataTest, TokenFileChangedDuringTheRun) {
  std::vector<int32_t> toks(600);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 7919) % 65536);
  for (TokenWidth w : {TokenWidth::kU16, TokenWidth::kU32}) {
    const std::string p = (dir_ / "run.bin").string();
    write_token_file(p, toks, w);
    TokenFile f(p);
    std::vector<int32_t> out(100, -1);
    f.read(450, 100, out.data());
    EXPECT_EQ(out, std::vector<int32_t>(toks.begin() + 450, toks.begin() + 550));
  }
  const std::string p = (dir_ / "run.bin").string();
  write_token_file(p, toks);
  std::vector<int32_t> out(100);
  {
    TokenFile f(p);
    fs::resize_file(p, 1024 + 2 * 300);
    EXPECT_CONTAINS(data_error([&] { f.read(400, 100, out.data()); }),
                    "token file '" + p +
                        "' was truncated during the run to 1624 bytes (its header says 600 "
                        "tokens, 2224 bytes) before reading byte offset 1824");
  }
  write_token_file(p, toks);
  {
    TokenFile f(p);
    std::vector<int32_t> other = toks;
    other[0] = 1;
    const std::string tmp = (dir_ / "new.bin").string();
    write_token_file(tmp, other);
    fs::rename(tmp, p);
    EXPECT_CONTAINS(data_error([&] { f.read(10, 5, out.data()); }),
                    "token file '" + p + "' was replaced during the run");
    EXPECT_CONTAINS(data_error([&] { f.read(10, 5, out.data()); }), "byte offset 1044");
    fs::remove(p);
    EXPECT_CONTAINS(data_error([&] { f.read(10, 5, out.data()); }), "disappeared during the run");
  }
  write_token_file(p, toks);
  {
    TokenFile f(p);
    {
      std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(1030);
      io.write("xy", 2);
    }
    // The same size and inode, a new modification time.
    fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(5));
    EXPECT_CONTAINS(data_error([&] { f.read(0, 5, out.data()); }),
                    "was modified during the run (2224 -> 2224 bytes) before reading byte offset "
                    "1024");
  }
}

// ---- loader ----------------------------------------------------------------------------------

struct Batch {
  std::vector<int32_t> inputs, labels;
  bool operator==(const Batch&) const = default;
};

Batch next_batch(TokenLoader& l) {
  Batch b{std::vector<int32_t>(size_t(l.local_batch() * l.seq_len())),
          std::vector<int32_t>(size_t(l.local_batch() * l.seq_len()))};
  l.next(b.inputs.data(), b.labels.data());
  return b;
}

// Window j's seq_len + 1 tokens from a batch: row i's inputs plus its last label.
std::vector<int32_t> window_of(const Batch& b, int64_t row, int64_t s) {
  std::vector<int32_t> w(b.inputs.begin() + row * s, b.inputs.begin() + (row + 1) * s);
  w.push_back(b.labels[size_t((row + 1) * s - 1)]);
  return w;
}

// Seven documents of lengths 3,4,5,6,7,8,3 (36 bytes): packed with BOS/EOS they are 50 tokens,
// exactly 5 windows of seq_len 9 + 1.
DataSource small_source() {
  std::vector<std::string> docs{"abc", "defg", "hijkl", "mnopqr", "stuvwxy", "zABCDEFG", "HIJ"};
  DataSource s;
  s.dataset = "text";
  s.corpus = std::make_shared<const TextCorpus>(TextCorpus::from_documents("text", "mem", docs));
  return s;
}

// Splits a packed stream into documents (BOS ... EOS), checking the framing.
std::vector<std::string> unpack(const std::vector<int32_t>& stream) {
  std::vector<std::string> docs;
  size_t i = 0;
  while (i < stream.size()) {
    EXPECT_EQ(stream[i], ByteTokenizer::kBos) << "at " << i;
    size_t j = i + 1;
    std::string d;
    while (j < stream.size() && stream[j] != ByteTokenizer::kEos) d.push_back(char(stream[j++]));
    EXPECT_LT(j, stream.size()) << "document without EOS";
    docs.push_back(d);
    i = j + 1;
  }
  return docs;
}

// The whole stream of one epoch, read by a 1-rank loader with one row per micro-batch.
std::vector<int32_t> epoch_stream(TokenLoader& l, int64_t windows) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k < windows; ++k) {
    std::vector<int32_t> w = window_of(next_batch(l), 0, l.seq_len());
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

TEST(DataLoader, ShiftPackingAndEpochReshuffle) {
  ByteTokenizer tok;
  DataSource src = small_source();
  TokenLoader l(src, tok, 9, 1, 0, 1, 1, 7);
  EXPECT_EQ(l.tokens_per_epoch(), 50);
  EXPECT_EQ(l.windows_per_epoch(), 5);
  EXPECT_CONTAINS(l.description(), "text: 7 documents, 36 B, 50 tokens/epoch");
  Batch b = next_batch(l);
  for (int k = 0; k + 1 < 9; ++k) EXPECT_EQ(b.labels[size_t(k)], b.inputs[size_t(k) + 1]);
  EXPECT_EQ(b.inputs[0], ByteTokenizer::kBos);
  TokenLoader fresh(src, tok, 9, 1, 0, 1, 1, 7);
  std::vector<int32_t> e0 = epoch_stream(fresh, 5), e1 = epoch_stream(fresh, 5);
  std::vector<std::string> d0 = unpack(e0), d1 = unpack(e1);
  std::vector<std::string> sorted0 = d0, sorted1 = d1,
                           want{"abc", "defg", "hijkl", "mnopqr", "stuvwxy", "zABCDEFG", "HIJ"};
  std::sort(sorted0.begin(), sorted0.end()), std::sort(sorted1.begin(), sorted1.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sorted0, want);  // every document exactly once per epoch
  EXPECT_EQ(sorted1, want);
  EXPECT_NE(d0, d1);  // epoch 1 is reshuffled
}

TEST(DataLoader, SeedDecidesOrder) {
  ByteTokenizer tok;
  DataSource src = small_source();
  TokenLoader a(src, tok, 9, 2, 0, 1, 1, 1), b(src, tok, 9, 2, 0, 1, 1, 1),
      c(src, tok, 9, 2, 0, 1, 1, 2);
  bool differs = false;
  for (int step = 0; step < 6; ++step) {
    Batch x = next_batch(a), y = next_batch(b), z = next_batch(c);
    EXPECT_EQ(x, y) << "step " << step;
    differs = differs || !(x == z);
  }
  EXPECT_TRUE(differs);
}

TEST(DataLoader, EpochWrapDropsTailAndRestartsAtWindowZero) {
  ByteTokenizer tok;
  DataSource src = small_source();
  // seq_len 11: 50 tokens hold 4 windows of 12 (48); the 2-token tail is dropped.
  TokenLoader l(src, tok, 11, 3, 0, 1, 1, 5);
  EXPECT_EQ(l.windows_per_epoch(), 4);
  Batch s0 = next_batch(l), s1 = next_batch(l);  // windows 0-2, then 3 (epoch 0) and 4-5 (epoch 1)
  EXPECT_EQ(l.state().epoch, 1);
  EXPECT_EQ(s1.inputs[size_t(11)], ByteTokenizer::kBos);  // window 4 = epoch 1, window 0
  EXPECT_EQ(s0.inputs[0], ByteTokenizer::kBos);
  EXPECT_NE(window_of(s1, 1, 11), window_of(s0, 0, 11));  // a different shuffle
}

TEST(DataLoader, DataParallelShardingIdentity) {
  ByteTokenizer tok;
  DataSource src = open_data_source("fortunes", "");
  const int64_t S = 16, L = 2, D = 3;
  for (int64_t A : {1, 2}) {
    TokenLoader big(src, tok, S, L * D, 0, 1, A, 11);
    std::vector<std::unique_ptr<TokenLoader>> ranks;
    for (int64_t r = 0; r < D; ++r)
      ranks.push_back(std::make_unique<TokenLoader>(src, tok, S, L, r, D, A, 11));
    for (int64_t step = 0; step < 3; ++step)
      for (int64_t m = 0; m < A; ++m) {
        Batch whole = next_batch(big);
        for (int64_t r = 0; r < D; ++r) {
          Batch part = next_batch(*ranks[size_t(r)]);
          for (int64_t i = 0; i < L; ++i)
            EXPECT_EQ(window_of(part, i, S), window_of(whole, r * L + i, S))
                << "A=" << A << " step " << step << " micro " << m << " rank " << r << " row " << i;
          EXPECT_EQ(ranks[size_t(r)]->window_index(step, m, r, 0),
                    big.window_index(step, m, 0, r * L));
        }
      }
  }
}

TEST(DataLoader, StateRestoreResumesExactly) {
  ByteTokenizer tok;
  DataSource src = small_source();
  TokenLoader a(src, tok, 9, 2, 1, 2, 2, 3);
  for (int i = 0; i < 5; ++i) next_batch(a);
  TokenLoader::State st = a.state();
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.micro_batch, 1);
  std::vector<Batch> after;
  for (int i = 0; i < 4; ++i) after.push_back(next_batch(a));
  TokenLoader b(src, tok, 9, 2, 1, 2, 2, 3);
  b.restore(st);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(next_batch(b), after[size_t(i)]) << i;
  TokenLoader::State wrong = st;
  wrong.epoch += 1;
  EXPECT_CONTAINS(data_error([&] { b.restore(wrong); }),
                  "did the dataset, seq_len or batch size change");
  wrong = st, wrong.micro_batch = 2;
  EXPECT_CONTAINS(data_error([&] { b.restore(wrong); }), "micro_batch in [0, 2)");
}

// The checkpoint rule: a run resumed at a checkpoint's next_window() continues at the first
// window no rank has read. With the same global batch on another layout (D ranks of L rows) the
// rows are exactly the uninterrupted run's; with another global batch nothing is skipped or read
// twice.
TEST(DataLoader, ResumeAtTheSavedWindowOnAnyLayout) {
  ByteTokenizer tok;
  DataSource src = small_source();
  const int64_t seq = 5;
  std::vector<std::unique_ptr<TokenLoader>> saved;
  for (int r = 0; r < 4; ++r)
    saved.push_back(std::make_unique<TokenLoader>(src, tok, seq, 2, r, 4, 1, 3));
  for (int t = 0; t < 3; ++t)
    for (auto& l : saved) next_batch(*l);
  const int64_t w = saved[0]->next_window();
  EXPECT_EQ(w, 3 * 4 * 2);
  for (auto& l : saved) EXPECT_EQ(l->next_window(), w);  // the same on every dp rank
  TokenLoader whole(src, tok, seq, 8, 0, 1, 1, 3);       // the uninterrupted 1-rank run
  for (int t = 0; t < 3; ++t) next_batch(whole);
  std::vector<Batch> want;
  for (int t = 0; t < 2; ++t) want.push_back(next_batch(whole));
  for (int r = 0; r < 2; ++r) {  // dp 2 x 4 rows: the same global batch
    TokenLoader l(src, tok, seq, 4, r, 2, 1, 3);
    l.resume_at(3, w);
    for (int t = 0; t < 2; ++t) {
      Batch got = next_batch(l);
      const size_t n = size_t(4 * seq), at = size_t(r) * n;
      EXPECT_EQ(got.inputs, std::vector<int32_t>(want[size_t(t)].inputs.begin() + long(at),
                                                 want[size_t(t)].inputs.begin() + long(at + n)));
    }
    EXPECT_EQ(l.next_window(), w + 2 * 8);
  }
  TokenLoader one(src, tok, seq, 8, 0, 1, 1, 3);
  one.resume_at(3, w);
  EXPECT_EQ(next_batch(one), want[0]);
  // Another global batch (dp 3 x 1 row): step 7 starts at window w, step 8 right after it.
  TokenLoader other(src, tok, seq, 1, 2, 3, 1, 3);
  other.resume_at(7, w);
  EXPECT_EQ(other.window_index(7, 0, 0, 0), w);
  EXPECT_EQ(other.window_index(7, 0, 2, 0), w + 2);
  EXPECT_EQ(other.window_index(8, 0, 0, 0), w + 3);
  TokenLoader::State st = other.state();  // the offset survives state/restore
  TokenLoader again(src, tok, seq, 1, 2, 3, 1, 3);
  again.restore(st);
  EXPECT_EQ(next_batch(again), next_batch(other));
  EXPECT_THROW(again.resume_at(-1, 0), DataError);
}

TEST(DataLoader, NextAllocatesNothing) {
  ByteTokenizer tok;
  DataSource src = small_source();
  TokenLoader l(src, tok, 9, 3, 0, 1, 1, 9);
  std::vector<int32_t> in(27), lab(27);
  const int64_t count = allocation_count();
  const size_t heap = mallinfo2().uordblks;
  for (int i = 0; i < 40; ++i) l.next(in.data(), lab.data());  // crosses many epochs
  EXPECT_EQ(allocation_count(), count);
  EXPECT_EQ(mallinfo2().uordblks, heap);
  EXPECT_GE(l.state().epoch, 20);
}

TEST_F(DataTest, TokensDatasetIsTheConcatenationWithoutShuffle) {
  std::vector<int32_t> a(23), b(17);
  for (size_t i = 0; i < a.size(); ++i) a[i] = int32_t(1000 + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = int32_t(2000 + i);
  write_token_file((dir_ / "b.bin").string(), b);  // sorted by name: a.bin first
  write_token_file((dir_ / "a.bin").string(), a);
  write("readme.md", "ignored");
  DataSource src = open_data_source("tokens", dir_.string());
  ASSERT_EQ(src.token_files.size(), 2u);
  ByteTokenizer tok;
  TokenLoader l(src, tok, 7, 1, 0, 1, 1, 0);
  EXPECT_EQ(l.tokens_per_epoch(), 40);
  EXPECT_EQ(l.windows_per_epoch(), 5);
  EXPECT_EQ(l.max_token_id(), 2016);
  EXPECT_EQ(l.description(), "tokens: 2 files, 40 tokens/epoch (max id 2016)");
  std::vector<int32_t> cat = a;
  cat.insert(cat.end(), b.begin(), b.end());
  std::vector<int32_t> stream = epoch_stream(l, 5);
  EXPECT_EQ(stream, cat);  // window 2 crosses from a.bin into b.bin
  EXPECT_EQ(window_of(next_batch(l), 0, 7), std::vector<int32_t>(cat.begin(), cat.begin() + 8));
  TokenLoader seeded(src, tok, 7, 1, 0, 1, 1, 99);
  EXPECT_EQ(epoch_stream(seeded, 5), cat);
  EXPECT_CONTAINS(data_error([&] { open_data_source("tokens", (dir_ / "none").string()); }),
                  "not found");
}

TEST(DataLoader, ErrorsForTooLittleDataAndBadArguments) {
  ByteTokenizer tok;
  DataSource src = small_source();
  EXPECT_CONTAINS(
      data_error([&] { TokenLoader l(src, tok, 50, 1, 0, 1, 1, 0); }),
      "text dataset: 50 tokens per epoch, fewer than one window of seq_len + 1 = 51 tokens");
  EXPECT_THROW(TokenLoader(src, tok, 9, 1, 2, 2, 1, 0), ValueError);
  EXPECT_THROW(open_data_source("c4", ""), ConfigError);
}

TEST(DataLoader, InstalledFortunesDescription) {
  ByteTokenizer tok;
  DataSource src = open_data_source("fortunes", "");
  TokenLoader l(src, tok, 128, 4, 0, 1, 1, 0);
  EXPECT_EQ(l.tokens_per_epoch(), src.corpus->num_bytes() + 2 * src.corpus->num_documents());
  EXPECT_CONTAINS(l.description(), "fortunes: ");
  EXPECT_CONTAINS(l.description(), " documents, ");
  EXPECT_CONTAINS(l.description(), "M tokens/epoch");
}

}  // namespace
}  // namespace meshtrain
