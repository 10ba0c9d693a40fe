// meshtrain command line: `train`, `plan`, `convert` and `tokenize` subcommands. Thin: parsing and
// error reporting here, the work in train/. Every failure is one clear line and a non-zero exit; in
// a multi-rank run the failing rank aborts the job so no rank hangs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/core/version.h"
#include "meshtrain/data/tokenize_dataset.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/launch/backends_info.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/convert.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/plan_report.h"
#include "meshtrain/train/trainer.h"

namespace {

// One entry per command: its usage line, what it does and its own options. `meshtrain --help`
// lists them; `meshtrain <command> --help` prints one, with every config key for train and plan.
struct Command {
  const char* name;
  const char* usage;
  const char* summary;
  const char* options;
  bool config_keys;
};
const Command kCommands[] = {
    {"train", "train --config FILE [--nproc N [--share-gpu]] [--section.key VALUE ...]",
     "train a model; --nproc N starts N local ranks (mpirun -np N, srun, torchrun also work)",
     "  --config FILE     TOML job config (torchtitan's sections; also --job.config_file)\n"
     "  --nproc N         start N local ranks under mpirun\n"
     "  --share-gpu       let ranks share GPUs (a test setup: NCCL over sockets on lo, exact\n"
     "                    results, slow communication); MESHTRAIN_SHARE_GPU=1 does the same\n",
     true},
    {"plan",
     "plan --config FILE [--hf-config PATH] [--world N] [--rank R] [--dump-graph] "
     "[--section.key VALUE ...]",
     "print parameter counts, FLOPs per token and the planned memory of one rank (no training)",
     "  --config FILE     TOML job config\n"
     "  --hf-config PATH  size the model from a Hugging Face config.json (or its folder)\n"
     "  --world N         ranks of the layout (default: the smallest the degrees fit)\n"
     "  --rank R          the rank to plan (default 0)\n"
     "  --dump-graph      add the scheduled step and optimizer graphs, node by node\n"
     "  --cost-table F    kernel throughput table of the cost model (default: the device's\n"
     "                    shipped table; bench/cost/fit_table.py writes one)\n"
     "  --ranks-per-node N, --intra-gbps G, --intra-latency-us U, --inter-gbps G,\n"
     "  --inter-latency-us U   cost-model links (default: NVLink in a node, InfiniBand between)\n",
     true},
    {"convert",
     "convert --input PATH --output PATH [--dtype float32|bfloat16|float16] [--max-shard-gb G] "
     "[--config FILE] [--section.key VALUE ...]",
     "meshtrain checkpoint (a step-N folder) <-> Hugging Face folder, offline, tensor by tensor",
     "  --input PATH      a meshtrain step-N folder, or a Hugging Face folder (config.json +\n"
     "                    safetensors)\n"
     "  --output PATH     the folder to write (the other format)\n"
     "  --dtype NAME      dtype of an HF export (default float32)\n"
     "  --max-shard-gb G  size of each HF safetensors shard\n"
     "  --config FILE     the job config whose model the checkpoint holds (HF -> meshtrain)\n",
     true},
    {"tokenize",
     "tokenize --input PATH --output FILE.bin|FOLDER [--dataset text|jsonl|fortunes] "
     "[--hf-assets FOLDER] [--config FILE]",
     "write llm.c token files (uint16, or uint32 past 65,536 ids) with the HF tokenizer of "
     "--hf-assets / [model] hf_assets_path, else the byte tokenizer",
     "  --input PATH        a UTF-8 file, a folder of *.txt, a JSON-lines file or folder "
     "(fortunes:\n"
     "                      default /usr/share/games/fortunes)\n"
     "  --output PATH       the token file to write, or a folder for shards\n"
     "  --dataset NAME      text (default), jsonl or fortunes\n"
     "  --hf-assets FOLDER  tokenizer.json (and tokenizer_config.json) to tokenize with\n"
     "  --text-field NAME   jsonl: the field holding each document (default text)\n"
     "  --threads N         encoding threads (default: all cores)\n"
     "  --shard-tokens N    tokens per output shard when --output is a folder\n"
     "  --config FILE       take dataset, dataset_path, dataset_text_field and hf_assets_path\n"
     "                      from a job config (--section.key overrides too)\n",
     false},
};

std::string usage() {
  std::string u =
      "usage: meshtrain <command> [options]   (meshtrain <command> --help for more)\n"
      "       meshtrain --version\n\ncommands:\n";
  for (const Command& c : kCommands) u += fmt::format("  {}\n        {}\n", c.usage, c.summary);
  return u +
         "\nConfig keys follow torchtitan's TOML sections, e.g. --training.steps 20 or\n"
         "--parallelism.data_parallel_shard_degree 2. See configs/ for examples.\n";
}

std::string command_help(const Command& c) {
  std::string h =
      fmt::format("usage: meshtrain {}\n\n{}\n\noptions:\n{}", c.usage, c.summary, c.options);
  if (c.config_keys)
    h += "\nconfig keys (in the TOML file, or --section.key VALUE; a later override wins):\n" +
         meshtrain::job_config_schema().help_text();
  return h;
}

std::string version_text() {
  std::string v = fmt::format("meshtrain {} (commit {})\nbackends:\n",
                              meshtrain::meshtrain_version(), meshtrain::meshtrain_git_commit());
  for (const std::string& b : meshtrain::built_in_backends()) v += "  " + b + "\n";
  return v;
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  return false;
}

struct Args {
  std::string command;
  std::string config;
  std::vector<std::string> overrides;
  std::map<std::string, std::string> options;  // command-specific (--world, --input, ...)
};

// own_options take a value; own_flags do not (present: options[flag] = "1").
Args parse_args(int argc, char** argv, const std::vector<std::string>& own_options,
                const std::vector<std::string>& own_flags = {}) {
  Args a;
  if (argc < 2)
    MT_THROW(ConfigError,
             "no command given: expected train, plan, convert or tokenize (meshtrain --help)");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto takes_value = [&](const std::string& name) {
      MT_CHECK_T(ConfigError, i + 1 < argc, "{} expects a value", name);
      return std::string(argv[++i]);
    };
    if (s == "--config" || s == "--job.config_file") {
      a.config = takes_value(s);
    } else if (s.rfind("--config=", 0) == 0) {
      a.config = s.substr(9);
    } else if (std::find(own_options.begin(), own_options.end(), s) != own_options.end()) {
      a.options[s] = takes_value(s);
    } else if (std::find(own_flags.begin(), own_flags.end(), s) != own_flags.end()) {
      a.options[s] = "1";
    } else {
      a.overrides.push_back(s);
    }
  }
  return a;
}

int run_train(int argc, char** argv) {
  Args a = parse_args(argc, argv, {"--nproc"}, {"--share-gpu"});
  // The switch travels as an environment variable: launch_local forwards it to every rank, and
  // each rank's Runtime sets its NCCL variables from it before NCCL starts.
  if (a.options.count("--share-gpu")) ::setenv(meshtrain::kShareGpuVar, "1", /*overwrite=*/1);
  if (a.options.count("--nproc")) {
    int n = std::stoi(a.options["--nproc"]);
    MT_CHECK_T(ConfigError, n >= 1, "--nproc expects a positive rank count, found {}", n);
    if (n > 1 || meshtrain::detect_launch().world_size == 1)
      return meshtrain::launch_local(n, argc, argv);
  }
  MT_CHECK_T(ConfigError, !a.config.empty(), "train needs --config FILE (see configs/)");
  meshtrain::JobConfig cfg = meshtrain::parse_job_config(a.config, a.overrides);
  meshtrain::Runtime runtime(&argc, &argv);
  meshtrain::Trainer trainer(cfg, runtime);
  trainer.train();
  // A stop signal ended the run after an agreed step (and its checkpoint): a status of its own.
  return trainer.interrupted() != 0 ? meshtrain::kExitInterrupted : 0;
}

int run_plan(int argc, char** argv) {
  Args a = parse_args(argc, argv,
                      {"--world", "--rank", "--hf-config", "--cost-table", "--ranks-per-node",
                       "--intra-gbps", "--intra-latency-us", "--inter-gbps", "--inter-latency-us"},
                      {"--dump-graph"});
  MT_CHECK_T(ConfigError, !a.config.empty() || a.options.count("--hf-config"),
             "plan needs --config FILE (see configs/) or --hf-config PATH");
  if (a.options.count("--hf-config")) {
    // The model family follows config.json's architecture; explicit overrides still win.
    const std::string path = a.options["--hf-config"];
    a.overrides.insert(
        a.overrides.begin(),
        {"--model.name", meshtrain::read_hf_config(path).model_name, "--model.hf_config", path});
  }
  meshtrain::JobConfig cfg = meshtrain::parse_job_config(a.config, a.overrides);
  int world = a.options.count("--world") ? std::stoi(a.options["--world"]) : 0;
  int rank = a.options.count("--rank") ? std::stoi(a.options["--rank"]) : 0;
  meshtrain::PlanCostOptions cost;
  auto num = [&](const char* key) {
    return a.options.count(key) ? std::stod(a.options[key]) : 0.0;
  };
  if (a.options.count("--cost-table")) cost.table = a.options["--cost-table"];
  cost.ranks_per_node = int(num("--ranks-per-node"));
  cost.intra_gbps = num("--intra-gbps");
  cost.intra_latency_us = num("--intra-latency-us");
  cost.inter_gbps = num("--inter-gbps");
  cost.inter_latency_us = num("--inter-latency-us");
  std::printf(
      "%s",
      meshtrain::plan_report(cfg, world, rank, a.options.count("--dump-graph") > 0, cost).c_str());
  return 0;
}

int run_convert(int argc, char** argv) {
  Args a = parse_args(argc, argv, {"--input", "--output", "--dtype", "--max-shard-gb"});
  meshtrain::ConvertRequest r;
  r.input = a.options["--input"];
  r.output = a.options["--output"];
  r.config = a.config;
  r.overrides = a.overrides;
  if (a.options.count("--dtype")) r.dtype = a.options["--dtype"];
  if (a.options.count("--max-shard-gb")) {
    const double gb = std::stod(a.options["--max-shard-gb"]);
    MT_CHECK_T(ConfigError, gb > 0, "--max-shard-gb expects a positive size, found {}", gb);
    r.max_shard_bytes = int64_t(gb * 1e9);
  }
  meshtrain::run_convert(r);
  return 0;
}

// A text dataset to llm.c token files with the run's tokenizer ([BOS] doc [EOS] per document).
// Defaults come from --config (dataset, dataset_path, dataset_text_field, hf_assets_path); the
// command's own flags override them.
int run_tokenize(int argc, char** argv) {
  Args a = parse_args(argc, argv,
                      {"--input", "--output", "--dataset", "--hf-assets", "--text-field",
                       "--threads", "--shard-tokens"});
  MT_CHECK_T(ConfigError, a.options.count("--output"),
             "tokenize needs --output FILE.bin (or a folder for shards)");
  MT_CHECK_T(ConfigError, !a.config.empty() || a.overrides.empty(), "tokenize: unknown option '{}'",
             a.overrides.empty() ? "" : a.overrides.front());
  meshtrain::JobConfig cfg = meshtrain::parse_job_config(a.config, a.overrides);
  if (a.config.empty()) cfg.training.dataset = "text";  // the command's own default
  auto opt = [&](const char* name, const std::string& fallback) {
    return a.options.count(name) ? a.options[name] : fallback;
  };
  meshtrain::TokenizeOptions o;
  o.dataset = opt("--dataset", cfg.training.dataset);
  o.input = opt("--input", cfg.training.dataset_path);
  o.text_field = opt("--text-field", cfg.training.dataset_text_field);
  o.output = a.options["--output"];
  o.threads = std::stoi(opt("--threads", "0"));
  o.shard_tokens = std::stoll(opt("--shard-tokens", std::to_string(o.shard_tokens)));
  MT_CHECK_T(ConfigError, o.dataset == "fortunes" || o.dataset == "text" || o.dataset == "jsonl",
             "tokenize --dataset must be text, jsonl or fortunes, found '{}'", o.dataset);
  MT_CHECK_T(ConfigError, o.dataset == "fortunes" || !o.input.empty(),
             "tokenize --dataset {} needs --input PATH", o.dataset);
  auto tok = meshtrain::load_tokenizer(opt("--hf-assets", cfg.model.hf_assets_path));
  std::fprintf(stderr, "tokenizer: %s\n", tok->name().c_str());
  meshtrain::TokenizeSummary s = meshtrain::tokenize_dataset(*tok, o);
  std::printf("%s\n", s.describe(o).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string command = argc >= 2 ? argv[1] : "";
  try {
    for (const Command& c : kCommands)
      if (command == c.name && asks_for_help(argc, argv)) {
        std::printf("%s", command_help(c).c_str());
        return 0;
      }
    if (command == "--version" || command == "-V") {
      std::printf("%s", version_text().c_str());
      return 0;
    }
    if (command == "help" && argc >= 3)
      for (const Command& c : kCommands)
        if (std::strcmp(argv[2], c.name) == 0) {
          std::printf("%s", command_help(c).c_str());
          return 0;
        }
    if (command == "train") return run_train(argc, argv);
    if (command == "plan") return run_plan(argc, argv);
    if (command == "convert") return run_convert(argc, argv);
    if (command == "tokenize") return run_tokenize(argc, argv);
    if (command == "--help" || command == "-h" || command == "help") {
      std::printf("%s", usage().c_str());
      return 0;
    }
    MT_THROW(ConfigError,
             "unknown command '{}': expected train, plan, convert or tokenize (meshtrain --help)",
             command);
  } catch (const meshtrain::Error& e) {
    // A config error is the same on every rank: rank 0 alone reports it, every rank exits non-zero.
    const bool same_on_every_rank = e.kind() == meshtrain::ErrorKind::kConfig;
    const meshtrain::LaunchInfo launch = meshtrain::detect_launch();
    if (!same_on_every_rank || launch.rank == 0) std::fprintf(stderr, "meshtrain: %s\n", e.what());
    std::fflush(stderr);
    if (launch.world_size <= 1) return 1;
    // The other ranks let rank 0 print its line and end the job: an abort from them first would
    // kill rank 0 before it wrote (seen under mpirun). Still alive after a grace period, the error
    // was this rank's alone (a file only this node cannot read): it reports it and ends the job.
    if (same_on_every_rank && launch.rank != 0) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::fprintf(stderr, "meshtrain: rank %d: %s\n", launch.rank, e.what());
      std::fflush(stderr);
    }
    meshtrain::abort_all(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    std::fflush(stderr);
    if (meshtrain::detect_launch().world_size > 1) meshtrain::abort_all(1);
    return 1;
  }
}
