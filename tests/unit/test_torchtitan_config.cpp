// torchtitan compatibility of the config: every v0.2 key is recognised; the key structure of the
// train configs it ships loads; ignored keys give their notes; rejected values give errors that
// name the key, the value and why; nested sections, lists and the tokenizer/dataset fallbacks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/core/config.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/torchtitan_assets.h"
#include "test_support.h"

namespace meshtrain {
namespace {
namespace fs = std::filesystem;
using Args = std::vector<std::string>;

class TorchtitanConfigTest : public testing::TempDirTest {};

JobConfig parse(const std::string& toml, const Args& overrides = {}) {
  JobConfig c =
      job_config_from_values(load_config_string(job_config_schema(), toml, "t.toml", overrides));
  validate_job_config(c);
  return c;
}
std::string error_of(const std::string& toml, const Args& overrides = {}) {
  return testing::error_message<ConfigError>([&] { parse(toml, overrides); });
}
std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
fs::path structure_dir() { return fs::path(MT_TEST_SOURCE_DIR) / "tests/configs/torchtitan_v0.2"; }

// Every section and key of torchtitan v0.2's JobConfig (v0.2.0 to v0.2.2), [checkpoint] aside.
const std::map<std::string, std::vector<std::string>>& torchtitan_keys() {
  static const std::map<std::string, std::vector<std::string>> k = {
      {"job",
       {"config_file", "dump_folder", "description", "print_config", "save_config_file",
        "custom_config_module"}},
      {"profiling",
       {"enable_profiling", "save_traces_folder", "profile_freq", "profiler_active",
        "profiler_warmup", "enable_memory_snapshot", "save_memory_snapshot_folder"}},
      {"metrics",
       {"log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder",
        "save_for_all_ranks", "enable_wandb"}},
      {"model",
       {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
        "print_after_conversion"}},
      {"optimizer",
       {"name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
        "early_step_in_backward"}},
      {"lr_scheduler",
       {"warmup_steps", "total_steps", "decay_ratio", "decay_type", "min_lr_factor"}},
      {"training",
       {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm",
        "steps", "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce",
        "gc_freq", "gc_debug", "seed", "deterministic", "debug_moe_force_load_balance"}},
      {"training.dataloader",
       {"num_workers", "persistent_workers", "pin_memory", "prefetch_factor"}},
      {"parallelism",
       {"data_parallel_replicate_degree",
        "enable_compiled_autograd",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "disable_loss_parallel",
        "enable_async_tensor_parallel",
        "pipeline_parallel_degree",
        "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap",
        "context_parallel_degree",
        "context_parallel_load_balancer",
        "context_parallel_rotate_method",
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
        "expert_parallel_comm_backend"}},
      {"activation_checkpoint",
       {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
        "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
        "determinism_check", "debug"}},
      {"compile", {"enable", "components", "backend"}},
      {"quantize.linear.float8",
       {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
        "filter_fqns", "emulate"}},
      {"quantize.grouped_mm.float8", {"fqns"}},
      {"quantize.linear.mx", {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"}},
      {"quantize.grouped_mm.mx", {"recipe_name", "fqns"}},
      {"comm",
       {"init_timeout_seconds", "train_timeout_seconds", "trace_buf_size", "save_traces_folder",
        "save_traces_file_prefix", "mode"}},
      {"memory_estimation", {"enable", "disable_fake_mode"}},
      {"fault_tolerance",
       {"enable", "process_group", "process_group_timeout_ms", "replica_id", "group_size",
        "min_replica_size", "semi_sync_method"}},
      {"experimental", {"custom_import", "custom_args_module"}},
      {"validation",
       {"enable", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq", "steps"}},
      {"validation.dataloader",
       {"num_workers", "persistent_workers", "pin_memory", "prefetch_factor"}},
      {"debug", {"seed", "deterministic", "deterministic_warn_only", "moe_force_load_balance"}},
  };
  return k;
}

TEST_F(TorchtitanConfigTest, EveryV02KeyIsInTheSchema) {
  const Schema& s = job_config_schema();
  int n = 0;
  for (const auto& [section, keys] : torchtitan_keys())
    for (const std::string& key : keys) {
      EXPECT_NE(s.find(section, key), nullptr) << "[" << section << "] " << key;
      ++n;
    }
  EXPECT_EQ(n, 135);  // and 18 more in [checkpoint]
}

// The shipped configs' key structure loads unchanged, and the notes name the keys they ignore.
TEST_F(TorchtitanConfigTest, ShippedConfigStructuresLoad) {
  struct Case {
    const char* file;
    const char* name;
    const char* flavor;
  };
  for (Case c : {Case{"llama3_debug", "llama3", "debugmodel"}, Case{"llama3_8b", "llama3", "8B"},
                 Case{"deepseek_v3_debug", "deepseek_v3", "debugmodel"},
                 Case{"deepseek_v3_16b", "deepseek_v3", "16B"},
                 Case{"deepseek_v3_671b", "deepseek_v3", "671B"}}) {
    SCOPED_TRACE(c.file);
    std::string text = read(structure_dir() / (std::string(c.file) + ".toml"));
    ASSERT_FALSE(text.empty());
    // [checkpoint] joins once its keys exist in the schema (the checkpoint work defines them).
    if (job_config_schema().has_section("checkpoint"))
      text += "\n" + read(structure_dir() / (std::string(c.file) + ".checkpoint.toml"));
    JobConfig cfg = parse(text);
    EXPECT_EQ(cfg.model.name, c.name);
    EXPECT_EQ(cfg.model.flavor, c.flavor);
    bool compile_noted = false;
    for (const std::string& n : cfg.notes)
      compile_noted |=
          n.rfind("[compile] enable = ", 0) == 0 &&
          n.find("the whole step is always compiled into one graph; ignored") != std::string::npos;
    EXPECT_TRUE(compile_noted);
  }
}

TEST_F(TorchtitanConfigTest, RejectedValuesNameKeyValueAndReason) {
  EXPECT_EQ(error_of("[parallelism]\npipeline_parallel_degree = 2\n"),
            "[parallelism] pipeline_parallel_degree = 2 (t.toml line 2) is not supported: "
            "pipeline parallelism is not implemented; use data_parallel_shard_degree, "
            "tensor_parallel_degree or expert_parallel_degree");
  EXPECT_CONTAINS(error_of("[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n"),
                  "[quantize.linear.float8] recipe_name = \"rowwise\" (t.toml line 2) is not "
                  "supported: float8 training recipes are not implemented");
  EXPECT_CONTAINS(error_of("", {"--model.converters", "float8"}),
                  "[model] converters = [\"float8\"] (from --model.converters) is not supported: "
                  "model converters (float8, mx) change the GEMM numerics");
  EXPECT_CONTAINS(error_of("[training]\ndtype = \"bfloat16\"\n"),
                  "[training] dtype = \"bfloat16\" (t.toml line 2) is not supported: training "
                  "entirely in bfloat16 is not implemented");
  EXPECT_CONTAINS(error_of("[activation_checkpoint]\nmode = \"memory_budget\"\n"),
                  "[activation_checkpoint] mode = \"memory_budget\" (t.toml line 2) is not "
                  "supported: memory_budget is torch.compile's min-cut partitioner");
  EXPECT_CONTAINS(error_of("[debug]\nmoe_force_load_balance = true\n"),
                  "[training] debug_moe_force_load_balance = true (t.toml line 2) is not "
                  "supported: round-robin expert routing is not implemented");
  EXPECT_CONTAINS(error_of("[comm]\nmode = \"fake_backend\"\n"),
                  "meshtrain's dry run is `meshtrain plan --world N --rank R`");
  // Values a rejected key honours: its default, given explicitly.
  EXPECT_NO_THROW(parse("[parallelism]\npipeline_parallel_degree = 1\n[model]\nconverters = []\n"));
}

TEST_F(TorchtitanConfigTest, IgnoredKeysNoteWhatMeshtrainDoesInstead) {
  JobConfig t = parse("[training]\ndeterministic = true\n");
  ASSERT_EQ(t.notes.size(), 1u);
  EXPECT_EQ(t.notes[0],
            "[training] deterministic = true: meshtrain's step is always deterministic (fixed "
            "reduction orders, no atomics in reductions): nothing to switch on; ignored");
  JobConfig f = parse("[debug]\ndeterministic = false\n");
  ASSERT_EQ(f.notes.size(), 1u);
  EXPECT_CONTAINS(f.notes[0],
                  "[debug] deterministic = false: meshtrain's step is deterministic "
                  "regardless");
  EXPECT_CONTAINS(f.notes[0], "false does not trade that for speed; ignored");
  // Keys left at their default by omission say nothing.
  EXPECT_TRUE(parse("[training]\nsteps = 3\n").notes.empty());
  // The ignored values survive into the effective config, which reads back to the same values.
  JobConfig c = parse("[compile]\nenable = true\ncomponents = [\"loss\"]\n");
  const std::string toml = job_config_to_values(c).to_toml();
  EXPECT_CONTAINS(toml, "components = [\"loss\"]");
  EXPECT_EQ(job_config_to_values(parse(toml)).to_json(), job_config_to_values(c).to_json());
}

TEST_F(TorchtitanConfigTest, SeedMovedToDebugInV022) {
  EXPECT_EQ(parse("[debug]\nseed = 7\n").training.seed, 7);
  EXPECT_EQ(parse("", {"--debug.seed", "9"}).training.seed, 9);
  EXPECT_CONTAINS(error_of("[training]\nseed = 1\n[debug]\nseed = 2\n"),
                  "[training] seed is given twice in 't.toml' (once under another name)");
}

TEST_F(TorchtitanConfigTest, NestedSectionsAndLists) {
  JobConfig c = parse(
      "[training.dataloader]\nnum_workers = 4\n[quantize.grouped_mm.float8]\nfqns = "
      "\"experts,shared\"\n[parallelism]\nmodule_fqns_per_model_part = [[\"tok_embeddings\", "
      "\"layers.0\"], [\"layers.1\"]]\n");
  EXPECT_EQ(c.unhonoured.at("training.dataloader.num_workers"), ConfigValue(int64_t{4}));
  EXPECT_EQ(c.unhonoured.at("quantize.grouped_mm.float8.fqns"),
            ConfigValue(StringList{"experts", "shared"}));
  const std::string toml = job_config_to_values(c).to_toml();
  EXPECT_CONTAINS(toml, "[training.dataloader]\n");
  EXPECT_CONTAINS(
      toml, "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], [\"layers.1\"]]");
  EXPECT_EQ(job_config_to_values(parse(toml)).to_json(), job_config_to_values(c).to_json());
  // Overrides of nested sections: comma-separated lists and TOML array literals.
  JobConfig o = parse("", {"--quantize.linear.float8.filter_fqns", "output, router.gate",
                           "--compile.components=[\"model\"]"});
  EXPECT_EQ(o.unhonoured.at("quantize.linear.float8.filter_fqns"),
            ConfigValue(StringList{"output", "router.gate"}));
  EXPECT_EQ(o.unhonoured.at("compile.components"), ConfigValue(StringList{"model"}));
}

TEST_F(TorchtitanConfigTest, MisspeltNestedKeysAndBadLists) {
  EXPECT_CONTAINS(error_of("[quantize.linear.float8]\nfilter_fqn = []\n"),
                  "unknown key [quantize.linear.float8] filter_fqn (did you mean "
                  "[quantize.linear.float8] filter_fqns?)");
  EXPECT_CONTAINS(error_of("[quantize.linear.float9]\nemulate = true\n"),
                  "unknown section [quantize.linear.float9] (did you mean "
                  "[quantize.linear.float8]?)");
  EXPECT_CONTAINS(error_of("[training.dataloder]\nnum_workers = 1\n"),
                  "unknown section [training.dataloder] (did you mean [training.dataloader]?)");
  EXPECT_EQ(error_of("[compile]\ncomponents = \"model\"\n"),
            "[compile] components expects a list of strings, found string \"model\" (t.toml line "
            "2)");
  EXPECT_CONTAINS(error_of("[compile]\ncomponents = [1]\n"),
                  "[compile] components expects a list of strings, found an array with other "
                  "elements");
  EXPECT_CONTAINS(error_of("[parallelism]\nmodule_fqns_per_model_part = [\"a\"]\n"),
                  "expects a list of lists of strings, found an array with other elements");
}

TEST_F(TorchtitanConfigTest, HelpListsEveryKeyWithTypeDefaultAndDisposition) {
  const std::string help = job_config_schema().help_text();
  for (const auto& [section, keys] : torchtitan_keys()) {
    if (section == "debug") continue;  // [debug] seed and moe_force_load_balance are aliases
    EXPECT_CONTAINS(help, "\n[" + section + "]\n");
  }
  EXPECT_CONTAINS(help, "  --training.steps int (default 10000)\n      How many train steps");
  EXPECT_CONTAINS(help,
                  "  --compile.enable bool (default false)\n      torch.compile [ignored: "
                  "the whole step is always compiled into one graph]");
  EXPECT_CONTAINS(help, "--parallelism.pipeline_parallel_degree int (default 1)");
  EXPECT_CONTAINS(help, "[only the default: pipeline parallelism is not implemented");
  EXPECT_CONTAINS(help, "(also [debug] seed)");
  EXPECT_CONTAINS(help, "--compile.components list[str] (default [\"model\", \"loss\"])");
}

TEST_F(TorchtitanConfigTest, TokenizerFolderFallbackAndErrors) {
  EXPECT_TRUE(choose_tokenizer("").hf_folder.empty());
  EXPECT_TRUE(choose_tokenizer("").note.empty());
  // torchtitan's test tokenizer (its default path) is absent here: bytes stand in, with a note.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  TokenizerChoice t = choose_tokenizer("./tests/assets/tokenizer");
  DatasetChoice d = choose_dataset("training", "c4_test", "");
  fs::current_path(cwd);
  EXPECT_TRUE(t.hf_folder.empty());
  EXPECT_CONTAINS(t.note,
                  "(torchtitan's test tokenizer) has no tokenizer.json here: the byte "
                  "tokenizer stands in");
  EXPECT_EQ(d.dataset, "fortunes");
  EXPECT_CONTAINS(d.note, "[training] dataset \"c4_test\": torchtitan's test data");
  EXPECT_EQ(testing::error_message<ConfigError>([&] { choose_tokenizer("/nonexistent/llama"); }),
            "[model] hf_assets_path \"/nonexistent/llama\": no such folder; put the model's "
            "Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) there, or set "
            "hf_assets_path = \"\" for the byte tokenizer");
  EXPECT_CONTAINS(testing::error_message<ConfigError>([&] { choose_tokenizer(dir_.string()); }),
                  "the folder has no tokenizer.json");
  write("hf/tokenizer.json", "{}");
  EXPECT_EQ(choose_tokenizer((dir_ / "hf").string()).hf_folder, (dir_ / "hf").string());
  EXPECT_CONTAINS(
      testing::error_message<ConfigError>(
          [&] { choose_dataset("validation", "c4_validation", ""); }),
      "[validation] dataset \"c4_validation\" is streamed from the Hugging Face hub (allenai/c4, "
      "validation split) by torchtitan; meshtrain reads local files: set [validation] "
      "dataset_path");
  EXPECT_EQ(choose_dataset("training", "text", "/x").dataset, "text");
}

}  // namespace
}  // namespace meshtrain
