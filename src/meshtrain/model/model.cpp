// Model factory and the vocabulary rule shared by model families.
#include "meshtrain/model/model.h"

#include "meshtrain/model/deepseek_v3.h"
#include "meshtrain/model/llama3.h"

namespace meshtrain {

int64_t resolve_vocab(const ModelOptions& o, int64_t flavor_vocab) {
  int64_t v = o.vocab_override > 0 ? o.vocab_override
                                   : (flavor_vocab > 0 ? flavor_vocab : o.tokenizer_vocab);
  MT_CHECK_T(ConfigError, v > 0, "model {} {}: no vocabulary size (set [model] vocab_size)", o.name,
             o.flavor);
  MT_CHECK_T(ConfigError, o.tokenizer_vocab <= v,
             "model {} {} has vocab_size {} but token id {} occurs in {} (set [model] "
             "vocab_size >= {})",
             o.name, o.flavor, v, o.tokenizer_vocab - 1,
             o.vocab_source.empty() ? std::string("the tokenizer") : o.vocab_source,
             o.tokenizer_vocab);
  return v;
}

std::unique_ptr<Model> create_model(const ModelOptions& o) {
  if (o.name == "llama3") return create_llama3(o);
  if (o.name == "deepseek_v3") return create_deepseek_v3(o);
  MT_THROW(ConfigError, "[model] name '{}' is unknown: expected llama3 or deepseek_v3", o.name);
}

}  // namespace meshtrain
