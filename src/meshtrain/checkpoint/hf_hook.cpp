// Hugging Face import/export: not built yet. Both entry points fail with a clear ConfigError so a
// run that asks for them stops at start-up (hf_checkpoint_supported() is false).
#include "meshtrain/checkpoint/hf_hook.h"

namespace meshtrain {

bool hf_checkpoint_supported() { return false; }

HfLoadStats load_hf_checkpoint(const std::string& folder, const HfContext& ctx) {
  MT_THROW(ConfigError,
           "[checkpoint] initial_load_in_hf = true: loading Hugging Face weights ({}) is not built "
           "yet in this meshtrain",
           folder);
}

void save_hf_checkpoint(const std::string& folder, const HfContext& ctx, FileDType dtype) {
  MT_THROW(ConfigError,
           "[checkpoint] last_save_in_hf = true: writing Hugging Face weights ({}) is not built "
           "yet in this meshtrain",
           folder);
}

}  // namespace meshtrain
