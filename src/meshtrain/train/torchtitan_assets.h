// What a torchtitan config's tokenizer folder and dataset names mean here. torchtitan's debug
// configs point at its repository's test assets (./tests/assets/tokenizer, tests/assets/c4_test);
// where those are absent meshtrain substitutes its own debug inputs (byte tokenizer, fortunes)
// and says so. Any other missing folder, and c4 without a local copy, is an error.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/data/loader.h"
#include "meshtrain/data/tokenizer.h"

namespace meshtrain {

// torchtitan's default [model] hf_assets_path: its test tokenizer.
inline constexpr const char* kTorchtitanTestTokenizer = "./tests/assets/tokenizer";
// Where torchtitan's c4_test dataset lives in its repository.
inline constexpr const char* kTorchtitanC4Test = "tests/assets/c4_test";

struct TokenizerChoice {
  std::string hf_folder;  // a folder holding tokenizer.json; "" = the byte tokenizer
  std::string note;       // set when torchtitan's test tokenizer was absent and bytes stand in
};

// `hf_assets_path` "" = the byte tokenizer. ConfigError when a folder other than torchtitan's
// test tokenizer has no tokenizer.json, unless `for_sizing_only` (meshtrain plan): then the byte
// tokenizer stands in with a note, since sizing a model needs no tokenizer files.
TokenizerChoice choose_tokenizer(const std::string& hf_assets_path, bool for_sizing_only = false);
std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerChoice& choice);

struct DatasetChoice {
  std::string dataset;  // what open_data_source reads: fortunes | text | tokens | jsonl
  std::string path;
  std::string note;  // set when c4_test was absent and fortunes stand in
};

// `section` names the keys in messages ("training", "validation").
DatasetChoice choose_dataset(const std::string& section, const std::string& dataset,
                             const std::string& path);
DataSource open_dataset(const DatasetChoice& choice, const std::string& text_field);

}  // namespace meshtrain
