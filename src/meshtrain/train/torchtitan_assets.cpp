// Resolution of tokenizer folders and torchtitan dataset names (see torchtitan_assets.h).
#include "meshtrain/train/torchtitan_assets.h"

#include <filesystem>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace fs = std::filesystem;

namespace {
bool is_test_tokenizer(const std::string& path) {
  return fs::path(path).lexically_normal() == fs::path(kTorchtitanTestTokenizer).lexically_normal();
}
bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}
}  // namespace

TokenizerChoice choose_tokenizer(const std::string& hf_assets_path, bool for_sizing_only) {
  TokenizerChoice c;
  if (hf_assets_path.empty()) return c;
  const fs::path json = fs::path(hf_assets_path) / "tokenizer.json";
  std::error_code ec;
  if (fs::is_regular_file(json, ec)) {
    c.hf_folder = hf_assets_path;
    return c;
  }
  if (is_test_tokenizer(hf_assets_path)) {
    c.note = fmt::format(
        "[model] hf_assets_path \"{}\" (torchtitan's test tokenizer) has no tokenizer.json here: "
        "the byte tokenizer stands in",
        hf_assets_path);
    return c;
  }
  const char* what = exists(hf_assets_path) ? "the folder has no tokenizer.json" : "no such folder";
  if (for_sizing_only) {
    c.note = fmt::format(
        "[model] hf_assets_path \"{}\": {}; sized with the byte tokenizer's vocabulary unless "
        "the flavor or [model] vocab_size fixes it",
        hf_assets_path, what);
    return c;
  }
  MT_THROW(ConfigError,
           "[model] hf_assets_path \"{}\": {}; put the model's Hugging Face tokenizer files "
           "(tokenizer.json, tokenizer_config.json) there, or set hf_assets_path = \"\" for the "
           "byte tokenizer",
           hf_assets_path, what);
}

std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerChoice& choice) {
  return choice.hf_folder.empty() ? make_tokenizer("byte") : load_tokenizer(choice.hf_folder);
}

DatasetChoice choose_dataset(const std::string& section, const std::string& dataset,
                             const std::string& path) {
  DatasetChoice c{dataset, path, ""};
  if (dataset == "c4_test") {
    // torchtitan reads tests/assets/c4_test (JSON lines, "text" field) from its repository.
    c.dataset = "jsonl";
    if (!path.empty()) return c;
    if (exists(kTorchtitanC4Test)) {
      c.path = kTorchtitanC4Test;
      return c;
    }
    c.dataset = "fortunes";
    c.note = fmt::format(
        "[{}] dataset \"c4_test\": torchtitan's test data ({}) is not here: the fortunes corpus "
        "stands in",
        section, kTorchtitanC4Test);
    return c;
  }
  if (dataset == "c4" || dataset == "c4_validation") {
    MT_CHECK_T(ConfigError, !path.empty(),
               "[{}] dataset \"{}\" is streamed from the Hugging Face hub (allenai/c4, {} split) "
               "by torchtitan; meshtrain reads local files: set [{}] dataset_path to a JSON-lines "
               "file or folder of it, or choose dataset fortunes, text or tokens",
               section, dataset, dataset == "c4" ? "train" : "validation", section);
    c.dataset = "jsonl";
  }
  return c;
}

DataSource open_dataset(const DatasetChoice& choice, const std::string& text_field) {
  return open_data_source(choice.dataset, choice.path, text_field);
}

}  // namespace meshtrain
