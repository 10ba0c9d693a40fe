// Hugging Face tokenizer tests on tokenizer.json files built here: the pre-tokenizer splits of the
// Llama-3 and DeepSeek-V3 patterns (known answers worked out from the patterns by hand), BPE merge
// priority, added and special tokens, normalizers, the round trip over the fortunes corpus, and
// every bad-file error.
#include <gtest/gtest.h>

#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/data/hf_tokenizer.h"
#include "meshtrain/data/parallel_encode.h"
#include "meshtrain/data/pretokenizer.h"
#include "test_support.h"
#include "tokenizer_fixture.h"

namespace meshtrain {
namespace {
using json = nlohmann::json;
using Pieces = std::vector<std::string>;
using Ids = std::vector<int32_t>;

Pieces split(const json& pre, std::string_view text) {
  Pieces out;
  PreTokenizer::from_json(pre, "test").split(text, [&](std::string_view p) {
    out.emplace_back(p);
  });
  return out;
}

json sequence(std::vector<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", steps}}; }

class HfTokenizerTest : public testing::TempDirTest {
 protected:
  std::unique_ptr<HfTokenizer> load(const testing::TokenizerSpec& spec,
                                    const std::string& name = "tok") {
    return HfTokenizer::load(testing::write_tokenizer_folder((dir_ / name).string(), spec));
  }
  std::string load_error(const testing::TokenizerSpec& spec) {
    return testing::error_message<DataError>([&] { load(spec); });
  }
};

// ---- pre-tokenizer: Llama-3's pattern --------------------------------------------------------

TEST(HfPreTokenizer, Llama3ContractionsBothCases) {
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(),
                  "it's don't you're we've I'm they'll she'd IT'S DON'T YOU'RE WE'VE I'M "
                  "THEY'LL SHE'D"),
            (Pieces{"it",    "'s",  " don", "'t", " you",  "'re", " we",  "'ve", " I",   "'m",
                    " they", "'ll", " she", "'d", " IT",   "'S",  " DON", "'T",  " YOU", "'RE",
                    " WE",   "'VE", " I",   "'M", " THEY", "'LL", " SHE", "'D"}));
}

TEST(HfPreTokenizer, Llama3NumbersInGroupsOfThree) {
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(), "1234567 12 3.14159"),
            (Pieces{"123", "456", "7", " ", "12", " ", "3", ".", "141", "59"}));
}

TEST(HfPreTokenizer, Llama3WhitespaceRuns) {
  // A space run before a word leaves its last space to the word; newlines gather the whitespace
  // before them; trailing whitespace is one piece.
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(), "a  b\n\nc   \n d \t\n"),
            (Pieces{"a", " ", " b", "\n\n", "c", "   \n", " d", " \t\n"}));
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(), "end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(), "x \t y"), (Pieces{"x", " \t", " y"}));
}

TEST(HfPreTokenizer, Llama3Punctuation) {
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(), "Hello, world!!! (ok)... $10"),
            (Pieces{"Hello", ",", " world", "!!!", " (", "ok", ")...", " $", "10"}));
}

TEST(HfPreTokenizer, Llama3NonLatinScriptsAndEmoji) {
  const json p = testing::llama3_pre_tokenizer();
  EXPECT_EQ(split(p, "Привет мир"), (Pieces{"Привет", " мир"}));
  // A fullwidth comma is the optional non-letter prefix of the next word.
  EXPECT_EQ(split(p, "你好，世界"), (Pieces{"你好", "，世界"}));
  EXPECT_EQ(split(p, "مرحبا بالعالم"), (Pieces{"مرحبا", " بالعالم"}));
  // Emoji (and skin-tone modifiers) are neither letters nor numbers.
  EXPECT_EQ(split(p, "hi 👋🏽 there 🎉!"), (Pieces{"hi", " 👋🏽", " there", " 🎉!"}));
  // A combining mark is not a letter here (DeepSeek-V3's pattern keeps it, below).
  EXPECT_EQ(split(p, "cafe\u0301 ok"), (Pieces{"cafe", "\u0301", " ok"}));
}

TEST(HfPreTokenizer, InvalidUtf8BytesArePiecesOfTheirOwn) {
  EXPECT_EQ(split(testing::llama3_pre_tokenizer(),
                  "ab\xff\xfe"
                  "cd \xc3(x"),
            (Pieces{"ab", "\xff\xfe", "cd", " ", "\xc3", "(x"}));
}

// ---- pre-tokenizer: DeepSeek-V3's three splits -----------------------------------------------

TEST(HfPreTokenizer, DeepSeekV3Sequence) {
  const json p = testing::deepseek_v3_pre_tokenizer();
  EXPECT_EQ(split(p, "1234567 apples"), (Pieces{"123", "456", "7", " apples"}));
  EXPECT_EQ(split(p, "中文abc漢字"), (Pieces{"中文", "abc", "漢字"}));
  EXPECT_EQ(split(p, "Hello,world don't"), (Pieces{"Hello", ",world", " don", "'t"}));
  EXPECT_EQ(split(p, "cafe\u0301 ok"), (Pieces{"cafe\u0301", " ok"}));
  EXPECT_EQ(split(p, "ひらがなカタカナ!!\n\nx"), (Pieces{"ひらがなカタカナ", "!!\n\n", "x"}));
}

TEST(HfPreTokenizer, DigitsAndSplitBehaviours) {
  const json bl = testing::byte_level_step();
  EXPECT_EQ(split(sequence({{{"type", "Digits"}, {"individual_digits", true}}, bl}), "ab12c345"),
            (Pieces{"ab", "1", "2", "c", "3", "4", "5"}));
  EXPECT_EQ(split(sequence({{{"type", "Digits"}, {"individual_digits", false}}, bl}), "ab12c345"),
            (Pieces{"ab", "12", "c", "345"}));
  auto dash = [&](const char* behavior, bool invert = false) {
    return split(sequence({{{"type", "Split"},
                            {"pattern", {{"String", "-"}}},
                            {"behavior", behavior},
                            {"invert", invert}},
                           bl}),
                 "the-final--countdown");
  };
  EXPECT_EQ(dash("Removed"), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(dash("Isolated"), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(dash("MergedWithPrevious"), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(dash("MergedWithNext"), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(dash("Contiguous"), (Pieces{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(dash("Removed", true), (Pieces{"-", "-", "-"}));
}

TEST(HfPreTokenizer, Gpt2ByteLevelWithPrefixSpace) {
  EXPECT_EQ(split(testing::byte_level_step(true, true), "Hello world it's"),
            (Pieces{" Hello", " world", " it", "'s"}));
  EXPECT_EQ(split(testing::byte_level_step(true, false), "  x"), (Pieces{" ", " x"}));
}

// ---- BPE ---------------------------------------------------------------------------------------

TEST_F(HfTokenizerTest, MergesApplyInRankOrderNotLongestMatch) {
  testing::TokenizerSpec s;
  // Ids: cd 256, ab 257, bc 258, abcd 259, abc 260.
  s.merges = {{"c", "d"}, {"a", "b"}, {"b", "c"}, {"ab", "cd"}, {"a", "bc"}};
  auto t = load(s);
  EXPECT_EQ(t->encode("abcd"), (Ids{259}));
  EXPECT_EQ(t->encode("abc"), (Ids{257, 'c'}));  // "ab" outranks "bc"; "abc" never forms
  EXPECT_EQ(t->encode("bcd"), (Ids{'b', 256}));  // "cd" first, then nothing joins b + cd
  EXPECT_EQ(t->encode("x abcd"), (Ids{'x', ' ', 259}));
  // The same file with merges as [a, b] pairs gives the same ids.
  s.merges_as_pairs = true;
  EXPECT_EQ(load(s, "pairs")->encode("abc bcd"), (Ids{257, 'c', ' ', 'b', 256}));
}

TEST_F(HfTokenizerTest, EqualRanksMergeLeftmostFirst) {
  testing::TokenizerSpec s;
  s.merges = {{"a", "a"}, {"aa", "aa"}};  // aa 256, aaaa 257
  auto t = load(s);
  EXPECT_EQ(t->encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t->encode("aaaaa"), (Ids{257, 'a'}));
  EXPECT_EQ(t->encode("aaaaaa"), (Ids{257, 256}));
}

TEST_F(HfTokenizerTest, IgnoreMergesTakesWholePiecesFromTheVocabulary) {
  testing::TokenizerSpec s;
  s.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}};  // ab 256, bc 257, abc 258
  EXPECT_EQ(load(s, "merging")->encode("abc"), (Ids{256, 'c'}));
  s.ignore_merges = true;
  EXPECT_EQ(load(s, "ignoring")->encode("abc"), (Ids{258}));
}

TEST_F(HfTokenizerTest, MultiByteCharactersAndInvalidBytes) {
  testing::TokenizerSpec s;
  s.merges = {{"\xd0", "\x9f"}};  // П = D0 9F -> 256
  auto t = load(s);
  EXPECT_EQ(t->encode("Пп"), (Ids{256, 0xD0, 0xBF}));
  const std::string bad =
      "ab\xff\xfe"
      "cd \xc3(x";
  EXPECT_EQ(t->encode(bad), (Ids{'a', 'b', 0xFF, 0xFE, 'c', 'd', ' ', 0xC3, '(', 'x'}));
  EXPECT_EQ(t->decode(t->encode(bad)), bad);
}

TEST(HfPieceCache, FindsWhatWasInsertedAndStartsOverWhenFull) {
  PieceCache c;
  Ids out;
  EXPECT_FALSE(c.lookup("abc", out));
  c.insert("abc", Ids{1, 2});
  c.insert("abd", Ids{3});
  c.insert(std::string(PieceCache::kMaxPieceBytes + 1, 'x'), Ids{4});  // too long: not kept
  EXPECT_TRUE(c.lookup("abc", out));
  EXPECT_TRUE(c.lookup("abd", out));
  EXPECT_FALSE(c.lookup("ab", out));
  EXPECT_FALSE(c.lookup(std::string(PieceCache::kMaxPieceBytes + 1, 'x'), out));
  EXPECT_EQ(out, (Ids{1, 2, 3}));
  EXPECT_EQ(c.size(), 2u);
  for (size_t i = 0; c.size() < PieceCache::kMaxEntries; ++i) c.insert(std::to_string(i), Ids{7});
  c.insert("last", Ids{9});
  EXPECT_EQ(c.size(), 1u);
  out.clear();
  EXPECT_FALSE(c.lookup("abc", out));
  EXPECT_TRUE(c.lookup("last", out));
  EXPECT_EQ(out, (Ids{9}));
}

// ---- added and special tokens ------------------------------------------------------------------

TEST_F(HfTokenizerTest, AddedTokensMatchFirstLongestFirst) {
  testing::TokenizerSpec s;
  s.merges = {{"h", "i"}};  // hi 256
  s.added = {{"<|endoftext|>", 1000},
             {"<|end|>", 1001},
             {"<tag>", 1002, false},
             {"<|begin_of_text|>", 1003},
             {"<mask>", 1004, true, true, false}};
  s.bos_token = "<|begin_of_text|>";
  s.eos_token = "<|endoftext|>";
  auto t = load(s);
  const std::string text = "hi<|endoftext|>there<|end|><tag>x<|end a <mask> b";
  EXPECT_EQ(
      t->encode(text),
      (Ids{256, 1000, 't', 'h', 'e', 'r', 'e',  1001, 1002, 'x', '<',
           '|', 'e',  'n', 'd', ' ', 'a', 1004, ' ',  'b'}));  // <mask> lstrips the space before it
  EXPECT_EQ(t->vocab_size(), 1005);
  EXPECT_EQ(t->bos_id(), 1003);
  EXPECT_EQ(t->eos_id(), 1000);
  // BOS/EOS drop out of decode; other special tokens decode as written.
  EXPECT_EQ(t->decode(Ids{1003, 256, 1001, 'x', 1000}), "hi<|end|>x");
  EXPECT_EQ(t->token_id("<tag>"), 1002);
  EXPECT_EQ(t->token_id("hi"), 256);
  EXPECT_CONTAINS(t->name(), "BOS 1003 <|begin_of_text|>, EOS 1000 <|endoftext|>");

  s.add_bos_token = false;
  EXPECT_EQ(load(s, "no_bos")->bos_id(), -1);
  s.bos_token = s.eos_token = "";
  auto bare = load(s, "no_config");
  EXPECT_EQ(bare->bos_id(), -1);
  EXPECT_EQ(bare->eos_id(), -1);
}

TEST_F(HfTokenizerTest, NfcNormalizerComposes) {
  testing::TokenizerSpec s;
  s.normalizer = {{"type", "NFC"}};
  EXPECT_EQ(load(s)->encode("cafe\u0301"), (Ids{'c', 'a', 'f', 0xC3, 0xA9}));
  s.normalizer = nullptr;
  EXPECT_EQ(load(s, "none")->encode("cafe\u0301"), (Ids{'c', 'a', 'f', 'e', 0xCC, 0x81}));
}

TEST_F(HfTokenizerTest, DecodeErrorsNameTheId) {
  testing::TokenizerSpec s;
  s.added = {{"<x>", 300}};  // ids 256..299 have no token
  auto t = load(s);
  EXPECT_CONTAINS(testing::error_message<DataError>([&] {
                    t->decode(Ids{'a', 301});
                  }),
                  "token id at position 1 must be in [0, 301), found 301");
  EXPECT_CONTAINS(testing::error_message<DataError>([&] { t->decode(Ids{280}); }),
                  "token id 280 at position 0 has no token");
}

// ---- the fortunes corpus -----------------------------------------------------------------------

TEST_F(HfTokenizerTest, RoundTripOverTheFortunesCorpusAndThreadsAgree) {
  const TextCorpus c = TextCorpus::load_fortunes("");
  std::vector<std::string_view> docs;
  for (int64_t d = 0; d < c.num_documents(); ++d) docs.push_back(c.document(d));
  testing::TokenizerSpec s;
  s.merges = testing::frequent_word_merges(docs, s.pre_tokenizer, 3000);
  s.added = {{"<|endoftext|>", 60000}};
  auto t = load(s);
  const EncodedCorpus one = encode_corpus(*t, c, 1);
  const EncodedCorpus two = encode_corpus(*t, c, 2);
  EXPECT_EQ(one.tokens, two.tokens);
  EXPECT_EQ(one.offsets, two.offsets);
  ASSERT_EQ(one.offsets.size(), size_t(c.num_documents()) + 1);
  for (int64_t d = 0; d < c.num_documents(); ++d) {
    std::span<const int32_t> ids(one.tokens.data() + one.offsets[size_t(d)],
                                 size_t(one.offsets[size_t(d) + 1] - one.offsets[size_t(d)]));
    ASSERT_EQ(t->decode(ids), c.document(d)) << "document " << d;
  }
  // The merges do their work: well under one token per byte.
  EXPECT_LT(double(one.tokens.size()), 0.5 * double(c.num_bytes()));
  // The DeepSeek-V3 splits round-trip too.
  s.pre_tokenizer = testing::deepseek_v3_pre_tokenizer();
  auto ds = load(s, "ds");
  for (int64_t d = 0; d < c.num_documents(); d += 7)
    ASSERT_EQ(ds->decode(ds->encode(c.document(d))), c.document(d));
}

// ---- bad files ---------------------------------------------------------------------------------

TEST_F(HfTokenizerTest, UnsupportedModelTypesAreNamed) {
  testing::TokenizerSpec s;
  s.model_type = "WordPiece";
  EXPECT_CONTAINS(load_error(s), "model type \"WordPiece\" is not supported");
  s.model_type = "Unigram";
  EXPECT_CONTAINS(load_error(s), "model type \"Unigram\" is not supported");
}

TEST_F(HfTokenizerTest, MergeOfAnUnknownTokenIsQuoted) {
  testing::TokenizerSpec s;
  json j = testing::tokenizer_json(s);
  j["model"]["merges"] = json::array({"a b", "ab zz"});
  j["model"]["vocab"]["ab"] = 256;
  std::filesystem::create_directories(dir_ / "m");
  write("m/tokenizer.json", j.dump());
  EXPECT_CONTAINS(
      testing::error_message<DataError>([&] { HfTokenizer::load((dir_ / "m").string()); }),
      "merges entry 1 (\"ab zz\") names \"zz\", which is not in the vocabulary");
  j["model"]["merges"] = json::array({"a b", "a c"});  // "ac" is not in the vocabulary
  write("m/tokenizer.json", j.dump());
  EXPECT_CONTAINS(
      testing::error_message<DataError>([&] { HfTokenizer::load((dir_ / "m").string()); }),
      "merges entry 1 (\"a c\") makes \"ac\", which is not in the vocabulary");
}

TEST_F(HfTokenizerTest, RegexThatPcre2RejectsIsQuoted) {
  testing::TokenizerSpec s;
  s.pre_tokenizer =
      sequence({{{"type", "Split"}, {"pattern", {{"Regex", "(ab|c"}}}, {"behavior", "Isolated"}},
                testing::byte_level_step()});
  const std::string msg = load_error(s);
  EXPECT_CONTAINS(msg, "pre_tokenizer Split pattern: PCRE2 rejects the regex \"(ab|c\"");
  EXPECT_CONTAINS(msg, "missing closing parenthesis at offset 5");
}

TEST_F(HfTokenizerTest, UnsupportedNormalizersAndPreTokenizersAreNamed) {
  testing::TokenizerSpec s;
  s.normalizer = {{"type", "Lowercase"}};
  EXPECT_CONTAINS(load_error(s), "normalizer \"Lowercase\" is not supported");
  s.normalizer = nullptr;
  s.pre_tokenizer = {{"type", "Metaspace"}, {"replacement", "▁"}};
  EXPECT_CONTAINS(load_error(s), "pre_tokenizer type \"Metaspace\" is not supported");
  s.pre_tokenizer = sequence({testing::byte_level_step(), {{"type", "Digits"}}});
  EXPECT_CONTAINS(load_error(s), "step Digits after ByteLevel is not supported");
  s.pre_tokenizer = {{"type", "Digits"}};
  EXPECT_CONTAINS(load_error(s), "the pre_tokenizer must end with a ByteLevel step, found Digits");
}

TEST_F(HfTokenizerTest, MissingFilesAndTokens) {
  std::filesystem::create_directories(dir_ / "empty");
  EXPECT_CONTAINS(
      testing::error_message<DataError>([&] { HfTokenizer::load((dir_ / "empty").string()); }),
      "[model] hf_assets_path '" + (dir_ / "empty").string() + "' has no tokenizer.json");
  EXPECT_CONTAINS(
      testing::error_message<DataError>([&] { HfTokenizer::load((dir_ / "nope").string()); }),
      "is not a folder");
  write("j/tokenizer.json", "{\"model\": ");
  EXPECT_CONTAINS(
      testing::error_message<DataError>([&] { HfTokenizer::load((dir_ / "j").string()); }),
      "tokenizer.json' is not valid JSON");
  testing::TokenizerSpec s;
  s.bos_token = "<s>";
  EXPECT_CONTAINS(load_error(s), "bos_token \"<s>\" is not a token of");
  // load_tokenizer picks the byte tokenizer for "" and this one otherwise.
  EXPECT_EQ(load_tokenizer("")->vocab_size(), 258);
  s.bos_token = "";
  const std::string folder = testing::write_tokenizer_folder((dir_ / "ok").string(), s);
  EXPECT_EQ(load_tokenizer(folder)->source(), folder + "/tokenizer.json");
  EXPECT_EQ(load_tokenizer(folder + "/tokenizer.json")->vocab_size(), 256);
}

}  // namespace
}  // namespace meshtrain
