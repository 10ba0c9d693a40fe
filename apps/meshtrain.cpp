// meshtrain command line: `train`, `plan` and `tokenize` subcommands. Thin: parsing and error
// reporting here, the work in train/. Every failure is one clear line and a non-zero exit; in a
// multi-rank run the failing rank aborts the job so no rank hangs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/comm/bootstrap.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/data/text_dataset.h"
#include "meshtrain/data/token_file.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/train/job_config.h"
#include "meshtrain/train/plan_report.h"
#include "meshtrain/train/trainer.h"

namespace {

const char* kUsage =
    "usage: meshtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train --config FILE [--nproc N] [--section.key VALUE ...]\n"
    "        train a model; --nproc N starts N local ranks (mpirun -np N also works)\n"
    "  plan  --config FILE [--world N] [--rank R] [--dump-graph] [--section.key VALUE ...]\n"
    "        print parameter counts, FLOPs per token and the planned memory of a rank;\n"
    "        --dump-graph adds its scheduled step and optimizer graphs, node by node\n"
    "  tokenize --input PATH --output FILE.bin [--dataset text|fortunes]\n"
    "        write a pre-tokenized token file (byte-level tokenizer, llm.c format)\n"
    "\n"
    "Config keys follow torchtitan's TOML sections, e.g. --training.steps 20 or\n"
    "--parallelism.data_parallel_shard_degree 2. See configs/ for examples.\n";

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
    MT_THROW(ConfigError, "no command given: expected train, plan or tokenize (meshtrain --help)");
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
  Args a = parse_args(argc, argv, {"--nproc"});
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
  return 0;
}

int run_plan(int argc, char** argv) {
  Args a = parse_args(argc, argv, {"--world", "--rank"}, {"--dump-graph"});
  MT_CHECK_T(ConfigError, !a.config.empty(), "plan needs --config FILE (see configs/)");
  meshtrain::JobConfig cfg = meshtrain::parse_job_config(a.config, a.overrides);
  int world = a.options.count("--world") ? std::stoi(a.options["--world"]) : 1;
  int rank = a.options.count("--rank") ? std::stoi(a.options["--rank"]) : 0;
  std::printf(
      "%s", meshtrain::plan_report(cfg, world, rank, a.options.count("--dump-graph") > 0).c_str());
  return 0;
}

// Packs documents as BOS doc EOS with the byte tokenizer into an llm.c-format token file.
int run_tokenize(int argc, char** argv) {
  Args a = parse_args(argc, argv, {"--input", "--output", "--dataset"});
  MT_CHECK_T(ConfigError, a.options.count("--output"), "tokenize needs --output FILE.bin");
  MT_CHECK_T(ConfigError, a.overrides.empty(), "tokenize: unknown option '{}'",
             a.overrides.front());
  std::string dataset = a.options.count("--dataset") ? a.options["--dataset"] : "text";
  std::string input = a.options.count("--input") ? a.options["--input"] : "";
  MT_CHECK_T(ConfigError, dataset == "text" || dataset == "fortunes",
             "tokenize --dataset must be text or fortunes, found '{}'", dataset);
  MT_CHECK_T(ConfigError, dataset == "fortunes" || !input.empty(),
             "tokenize --dataset text needs --input PATH");
  meshtrain::TextCorpus corpus = dataset == "fortunes" ? meshtrain::TextCorpus::load_fortunes(input)
                                                       : meshtrain::TextCorpus::load_text(input);
  auto tok = meshtrain::make_tokenizer("byte");
  std::vector<int32_t> ids;
  for (int64_t d = 0; d < corpus.num_documents(); ++d) {
    ids.push_back(tok->bos_id());
    std::vector<int32_t> doc = tok->encode(corpus.document(d));
    ids.insert(ids.end(), doc.begin(), doc.end());
    ids.push_back(tok->eos_id());
  }
  meshtrain::write_token_file(a.options["--output"], ids);
  std::printf("%s -> %s: %zu tokens\n", corpus.description().c_str(), a.options["--output"].c_str(),
              ids.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string command = argc >= 2 ? argv[1] : "";
  try {
    if (command == "train") return run_train(argc, argv);
    if (command == "plan") return run_plan(argc, argv);
    if (command == "tokenize") return run_tokenize(argc, argv);
    if (command == "--help" || command == "-h" || command == "help") {
      std::printf("%s", kUsage);
      return 0;
    }
    MT_THROW(ConfigError,
             "unknown command '{}': expected train, plan or tokenize (meshtrain --help)", command);
  } catch (const meshtrain::Error& e) {
    // A config error is the same on every rank: rank 0 alone reports it, every rank exits non-zero.
    if (e.kind() != meshtrain::ErrorKind::kConfig || meshtrain::detect_launch().rank == 0)
      std::fprintf(stderr, "meshtrain: %s\n", e.what());
    std::fflush(stderr);
    if (meshtrain::detect_launch().world_size > 1) meshtrain::abort_all(1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    std::fflush(stderr);
    if (meshtrain::detect_launch().world_size > 1) meshtrain::abort_all(1);
    return 1;
  }
}
