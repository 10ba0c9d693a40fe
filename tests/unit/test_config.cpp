// Config tests: every user-facing error text, precedence (override > file > default),
// booleans, the job-config extras (sentinels, aliases, bool-or-choice keys) and dump round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"
#include "meshtrain/core/config.h"
#include "meshtrain/train/job_config.h"
#include "test_support.h"

namespace meshtrain {
namespace {
namespace fs = std::filesystem;
using Args = std::vector<std::string>;

class ConfigTest : public testing::TempDirTest {};

template <typename F>
std::string config_error(F&& f) {
  return testing::error_message<ConfigError>(f);
}

JobConfig parse_text(ConfigTest* t, const std::string& toml, const Args& overrides = {}) {
  (void)t;
  ConfigValues v = load_config_string(job_config_schema(), toml, "test.toml", overrides);
  JobConfig c = job_config_from_values(v);
  validate_job_config(c);
  return c;
}

TEST_F(ConfigTest, DefaultsMatchStructAndTorchtitan) {
  JobConfig c = parse_job_config("", {});
  EXPECT_EQ(c.training.local_batch_size, 8);
  EXPECT_EQ(c.training.global_batch_size, -1);
  EXPECT_EQ(c.training.seq_len, 2048);
  EXPECT_EQ(c.training.steps, 10000);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 8e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 200);
  EXPECT_FALSE(c.lr_scheduler.decay_ratio.has_value());
  EXPECT_EQ(c.parallelism.data_parallel_shard_degree, -1);
  EXPECT_EQ(c.parallelism.fsdp_reshard_after_forward, ReshardAfterForward::kDefault);
  EXPECT_EQ(c.job.dump_folder, "./outputs");
  EXPECT_EQ(c.comm.init_timeout_seconds, 300);
  // The struct's own defaults and the schema's defaults are the same values.
  EXPECT_EQ(job_config_to_values(JobConfig{}).to_json(),
            ConfigValues(job_config_schema()).to_json());
}

TEST_F(ConfigTest, MissingFile) {
  EXPECT_EQ(config_error([&] { parse_job_config("x.toml", {}); }),
            "config file 'x.toml' not found");
}

TEST_F(ConfigTest, SyntaxErrorNamesLineAndColumn) {
  std::string p = write("bad.toml", "[training]\nsteps = 5\nseq_len = = 3\n");
  std::string msg = config_error([&] { parse_job_config(p, {}); });
  EXPECT_CONTAINS(msg, fmt::format("config file '{}' line 3, column", p));
  EXPECT_CONTAINS(msg, "TOML syntax error");
}

TEST_F(ConfigTest, UnknownKeySuggestsClosest) {
  std::string msg = config_error([&] { parse_text(this, "[training]\nstpes = 5\n"); });
  EXPECT_CONTAINS(msg, "unknown key [training] stpes (did you mean [training] steps?)");
  EXPECT_CONTAINS(msg, "test.toml line 2");
  // A key that lives in another section is found there.
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[training]\nlr = 0.1\n"); }),
                  "unknown key [training] lr (did you mean [optimizer] lr?)");
  // Nothing close: no suggestion.
  EXPECT_EQ(config_error([&] { parse_text(this, "[training]\nzzzzzzzzzzzz = 1\n"); }),
            "unknown key [training] zzzzzzzzzzzz (test.toml line 2)");
}

TEST_F(ConfigTest, UnknownSectionSuggestsClosest) {
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[trainig]\nsteps = 5\n"); }),
                  "unknown section [trainig] (did you mean [training]?)");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "steps = 5\n"); }),
                  "keys belong in a section (did you mean [training] steps?)");
}

TEST_F(ConfigTest, WrongType) {
  EXPECT_EQ(config_error([&] { parse_text(this, "[training]\nsteps = \"abc\"\n"); }),
            "[training] steps expects an integer, found string \"abc\" (test.toml line 2)");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[training]\nsteps = 1.5\n"); }),
                  "[training] steps expects an integer, found float 1.5");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[training]\nsteps = [1]\n"); }),
                  "[training] steps expects an integer, found an array");
  EXPECT_CONTAINS(
      config_error([&] { parse_text(this, "[training]\ndeterministic = \"yes\"\n"); }),
      "[training] deterministic expects a boolean (true/false/1/0), found string \"yes\"");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[optimizer]\nlr = \"fast\"\n"); }),
                  "[optimizer] lr expects a number, found string \"fast\"");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[job]\ndescription = 3\n"); }),
                  "[job] description expects a string, found integer 3");
}

TEST_F(ConfigTest, OutOfRange) {
  EXPECT_EQ(config_error([&] { parse_text(this, "[training]\nsteps = -1\n"); }),
            "[training] steps must be >= 1, found -1 (test.toml line 2)");
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[optimizer]\nbeta1 = 1.5\n"); }),
                  "[optimizer] beta1 must be in [0, 1], found 1.5");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--training.global_batch_size", "0"});
                  }),
                  "[training] global_batch_size must be >= 1 (or -1 = auto), found 0");
  EXPECT_CONTAINS(
      config_error([&] { parse_job_config("", {"--parallelism.data_parallel_shard_degree=-2"}); }),
      "must be >= 1 (or -1 = auto), found -2");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--parallelism.tensor_parallel_degree", "3000000000"});
                  }),
                  "[parallelism] tensor_parallel_degree must fit in a 32-bit integer");
}

TEST_F(ConfigTest, NotOneOfTheChoices) {
  EXPECT_EQ(config_error([&] { parse_text(this, "[model]\nname = \"gpt\"\n"); }),
            "[model] name must be one of llama3, deepseek_v3, found \"gpt\" (test.toml line 2)");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--training.dataset", "c5"});
                  }),
                  "[training] dataset must be one of fortunes, text, jsonl, tokens, c4_test, c4, "
                  "c4_validation, found \"c5\" (from --training.dataset)");
}

TEST_F(ConfigTest, IntegersAcceptedForFloats) {
  JobConfig c = parse_text(this, "[optimizer]\nlr = 1\n[training]\nmax_norm = 2\n");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1.0);
  EXPECT_DOUBLE_EQ(c.training.max_norm, 2.0);
  EXPECT_DOUBLE_EQ(parse_job_config("", {"--optimizer.lr", "3"}).optimizer.lr, 3.0);
}

TEST_F(ConfigTest, OverridesWinOverFileWinsOverDefault) {
  std::string p = write("c.toml", "[training]\nsteps = 5\nseq_len = 64\n[optimizer]\nlr = 0.01\n");
  JobConfig c = parse_job_config(p, {"--training.steps", "7", "--optimizer.lr=0.5"});
  EXPECT_EQ(c.training.steps, 7);     // override
  EXPECT_EQ(c.training.seq_len, 64);  // file
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.training.local_batch_size, 8);  // default
  ConfigValues v = load_config(job_config_schema(), p, {"--training.steps", "7"});
  EXPECT_EQ(v.source("training", "steps"), ValueSource::kOverride);
  EXPECT_EQ(v.source("training", "seq_len"), ValueSource::kFile);
  EXPECT_EQ(v.source("training", "local_batch_size"), ValueSource::kDefault);
  // The later of two overrides of one key wins.
  EXPECT_EQ(parse_job_config(p, {"--training.steps=1", "--training.steps=2"}).training.steps, 2);
}

TEST_F(ConfigTest, BooleanOverrides) {
  auto det = [](const Args& a) { return parse_job_config("", a).metrics.enable_tensorboard; };
  EXPECT_TRUE(det({"--metrics.enable_tensorboard"}));
  EXPECT_TRUE(det({"--metrics.enable_tensorboard", "--training.steps", "3"}));
  EXPECT_FALSE(det({"--metrics.enable_tensorboard", "false"}));
  EXPECT_FALSE(det({"--metrics.enable_tensorboard", "0"}));
  EXPECT_TRUE(det({"--metrics.enable_tensorboard", "1"}));
  EXPECT_TRUE(det({"--metrics.enable_tensorboard=true"}));
  EXPECT_FALSE(det({"--metrics.enable_tensorboard=False"}));
  EXPECT_FALSE(parse_job_config("", {"--metrics.enable_jsonl=0"}).metrics.enable_jsonl);
  EXPECT_CONTAINS(
      config_error([&] { det({"--metrics.enable_tensorboard=yes"}); }),
      "[metrics] enable_tensorboard expects a boolean (true/false/1/0), found string \"yes\"");
}

TEST_F(ConfigTest, OverrideErrors) {
  EXPECT_EQ(config_error([&] {
              parse_job_config("", {"--training.stpes", "5"});
            }),
            "unknown key [training] stpes (did you mean [training] steps?) in override "
            "'--training.stpes'");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--trainin.steps", "5"});
                  }),
                  "unknown section [trainin] (did you mean [training]?)");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--steps", "5"});
                  }),
                  "override '--steps' must name a key as --section.key");
  EXPECT_CONTAINS(config_error([&] { parse_job_config("", {"steps=5"}); }),
                  "unexpected argument 'steps=5'");
  EXPECT_EQ(config_error([&] { parse_job_config("", {"--training.steps"}); }),
            "override --training.steps needs a value ([training] steps expects an integer >= 1)");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--training.steps", "--training.seq_len", "4"});
                  }),
                  "override --training.steps needs a value");
  EXPECT_EQ(config_error([&] {
              parse_job_config("", {"--training.steps", "abc"});
            }),
            "[training] steps expects an integer, found string \"abc\" (from --training.steps)");
  EXPECT_CONTAINS(config_error([&] { parse_job_config("", {"--training.steps=-1"}); }),
                  "[training] steps must be >= 1, found -1 (from --training.steps)");
}

TEST_F(ConfigTest, ReshardAfterForwardAcceptsStringsAndBooleans) {
  auto raf = [&](const std::string& toml) {
    return parse_text(this, "[parallelism]\nfsdp_reshard_after_forward = " + toml + "\n")
        .parallelism.fsdp_reshard_after_forward;
  };
  EXPECT_EQ(raf("\"always\""), ReshardAfterForward::kAlways);
  EXPECT_EQ(raf("\"never\""), ReshardAfterForward::kNever);
  EXPECT_EQ(raf("\"default\""), ReshardAfterForward::kDefault);
  EXPECT_EQ(raf("true"), ReshardAfterForward::kAlways);
  EXPECT_EQ(raf("false"), ReshardAfterForward::kNever);
  EXPECT_EQ(parse_job_config("", {"--parallelism.fsdp_reshard_after_forward", "false"})
                .parallelism.fsdp_reshard_after_forward,
            ReshardAfterForward::kNever);
  EXPECT_CONTAINS(config_error([&] { raf("\"sometimes\""); }),
                  "[parallelism] fsdp_reshard_after_forward must be one of default, always, "
                  "never (or true = always, false = never), found \"sometimes\"");
  EXPECT_CONTAINS(config_error([&] { raf("1"); }), "found integer 1");
}

TEST_F(ConfigTest, SelectiveAcOption) {
  auto opt = [&](const std::string& v) {
    return parse_text(this, "[activation_checkpoint]\nselective_ac_option = " + v + "\n")
        .activation_checkpoint;
  };
  EXPECT_EQ(opt("\"op\"").selective_layer_interval(), 0);
  EXPECT_EQ(opt("\"2\"").selective_layer_interval(), 2);
  EXPECT_EQ(opt("\"free\"").selective_ac_option.kind, SelectiveAcKind::kFree);
  EXPECT_EQ(opt("\"free\"").selective_layer_interval(), 0);
  EXPECT_EQ(selective_ac_option_name(opt("\"free\"").selective_ac_option), "free");
  EXPECT_EQ(selective_ac_option_name(opt("3").selective_ac_option), "3");  // an integer, as text
  for (const char* bad : {"\"x\"", "\"0\"", "\"-2\"", "\"2.5\""})
    EXPECT_CONTAINS(config_error([&] { opt(bad); }),
                    "[activation_checkpoint] selective_ac_option must be \"op\", \"free\" or a "
                    "positive integer such as \"2\"")
        << bad;
}

TEST_F(ConfigTest, DecayRatioUnsetSentinelAndAlias) {
  EXPECT_FALSE(parse_text(this, "[lr_scheduler]\ndecay_ratio = -1\n").lr_scheduler.decay_ratio);
  EXPECT_DOUBLE_EQ(
      *parse_text(this, "[lr_scheduler]\ndecay_ratio = 0.25\n").lr_scheduler.decay_ratio, 0.25);
  EXPECT_CONTAINS(config_error([&] { parse_text(this, "[lr_scheduler]\ndecay_ratio = 1.5\n"); }),
                  "[lr_scheduler] decay_ratio must be in [0, 1] (or -1 = unset), found 1.5");
  // torchtitan's older name for min_lr_factor.
  EXPECT_DOUBLE_EQ(parse_text(this, "[lr_scheduler]\nlr_min = 0.1\n").lr_scheduler.min_lr_factor,
                   0.1);
  EXPECT_CONTAINS(config_error([&] {
                    parse_text(this, "[lr_scheduler]\nlr_min = 0.1\nmin_lr_factor = 0.2\n");
                  }),
                  "[lr_scheduler] min_lr_factor is given twice");
}

TEST_F(ConfigTest, CrossKeyChecks) {
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--training.global_batch_size", "12"});
                  }),
                  "[training] global_batch_size must be a multiple of [training] local_batch_size");
  EXPECT_CONTAINS(config_error([&] {
                    parse_job_config("", {"--training.mixed_precision_param", "float64"});
                  }),
                  "needs [training] master_dtype float64, found master_dtype float32");
  EXPECT_NO_THROW(parse_job_config(
      "", {"--training.mixed_precision_param", "float64", "--training.master_dtype", "float64"}));
}

TEST_F(ConfigTest, GradientAccumulation) {
  TrainingSection t;
  EXPECT_EQ(gradient_accumulation_steps(t, 4), 1);
  t.local_batch_size = 8, t.global_batch_size = 32;
  EXPECT_EQ(gradient_accumulation_steps(t, 2), 2);
  EXPECT_EQ(gradient_accumulation_steps(t, 4), 1);
  t.global_batch_size = 24;
  EXPECT_EQ(config_error([&] { gradient_accumulation_steps(t, 2); }),
            "[training] global_batch_size 24 must be a multiple of local_batch_size x "
            "data-parallel degree = 8 x 2 = 16");
}

TEST_F(ConfigTest, TomlDumpRoundTripsAndJsonIsTyped) {
  ConfigValues v =
      load_config(job_config_schema(), "",
                  {"--training.steps", "7", "--optimizer.eps", "1e-12", "--job.description",
                   "quote \" and \\ backslash", "--lr_scheduler.decay_ratio", "0.3",
                   "--parallelism.fsdp_reshard_after_forward", "true"});
  std::string toml = v.to_toml();
  EXPECT_CONTAINS(toml, "[training]\n");
  EXPECT_CONTAINS(toml, "# How many train steps to run\nsteps = 7\n");
  ConfigValues back = load_config(job_config_schema(), write("dump.toml", toml), {});
  EXPECT_EQ(back.to_json(), v.to_json());
  EXPECT_EQ(back.get_string("parallelism", "fsdp_reshard_after_forward"), "always");
  nlohmann::json j = nlohmann::json::parse(v.to_json());
  EXPECT_EQ(j["training"]["steps"], 7);
  EXPECT_EQ(j["optimizer"]["eps"], 1e-12);
  EXPECT_EQ(j["metrics"]["enable_jsonl"], true);
  EXPECT_EQ(j["job"]["description"], "quote \" and \\ backslash");
  for (const KeySpec& k : job_config_schema().keys())
    EXPECT_TRUE(j[k.section].contains(k.name)) << k.full_name();
  // The struct converts back to the same values.
  ConfigValues from_struct = job_config_to_values(job_config_from_values(v));
  EXPECT_EQ(from_struct.to_json(), v.to_json());
  EXPECT_EQ(from_struct.source("training", "steps"), ValueSource::kOverride);
  EXPECT_EQ(from_struct.source("training", "seq_len"), ValueSource::kDefault);
  // Defaults, sentinels included (decay_ratio = -1.0), read back from their own dump.
  ConfigValues defaults(job_config_schema());
  std::string dumped = write("defaults.toml", defaults.to_toml());
  EXPECT_EQ(load_config(job_config_schema(), dumped, {}).to_json(), defaults.to_json());
  EXPECT_FALSE(parse_job_config(dumped, {}).lr_scheduler.decay_ratio.has_value());
}

TEST_F(ConfigTest, GenericSchemaAndGetters) {
  Schema s;
  s.add(KeySpec::integer("a", "n", 3, "an int").in_range(0, 10));
  s.add(KeySpec::real("a", "x", 0.5, "a float"));
  s.add(KeySpec::boolean("b", "flag", false, "a flag"));
  s.add(KeySpec::choice("b", "mode", {"p", "q"}, "p", "a choice"));
  ConfigValues v = load_config_string(s, "[a]\nn = 4\n", "inline", {"--b.flag", "--b.mode=q"});
  EXPECT_EQ(v.get_int("a", "n"), 4);
  EXPECT_DOUBLE_EQ(v.get_float("a", "x"), 0.5);
  EXPECT_TRUE(v.get_bool("b", "flag"));
  EXPECT_EQ(v.get_string("b", "mode"), "q");
  EXPECT_THROW(v.get_bool("a", "n"), InternalError);  // wrong getter is a programming error
  EXPECT_CONTAINS(config_error([&] { v.set("a", "n", int64_t{11}); }),
                  "[a] n must be in [0, 10], found 11");
  // A schema whose default breaks its own range is rejected when built.
  Schema bad;
  EXPECT_THROW(bad.add(KeySpec::integer("a", "n", -1, "").at_least(0)), InternalError);
  EXPECT_THROW(s.add(KeySpec::integer("a", "n", 1, "")), InternalError);  // duplicate
}

TEST(ConfigEditDistance, CountsTranspositionsAsOne) {
  EXPECT_EQ(edit_distance("stpes", "steps"), 1);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("same", "same"), 0);
}

}  // namespace
}  // namespace meshtrain
