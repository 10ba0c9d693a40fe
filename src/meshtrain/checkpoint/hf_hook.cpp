// The checkpoint policy's entry points for Hugging Face weights, over the HF layer
// (hf_checkpoint.h): the policy's context plus the seq_len and compute dtype the layout needs.
#include "meshtrain/checkpoint/hf_hook.h"

#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace {
HfRunContext run_of(const HfContext& c) {
  return HfRunContext{c.model,        c.plan,
                      c.store,        c.backend,
                      c.seq_len,      c.plan.config().compute_dtype,
                      c.world.rank(), [&world = c.world] { world.barrier(); }};
}
}  // namespace

bool hf_checkpoint_supported() { return true; }

HfLoadStats load_hf_checkpoint(const std::string& folder, const HfContext& ctx) {
  const HfLoadReport r = load_hf_into_store(folder, run_of(ctx));
  if (ctx.world.rank() == 0)
    for (const std::string& n : r.notes) log_info("checkpoint: {}: {}", folder, n);
  return HfLoadStats{.bytes_read = r.bytes_read, .files_read = r.files};
}

void save_hf_checkpoint(const std::string& folder, const HfContext& ctx, FileDType dtype) {
  write_hf_folder(folder, run_of(ctx), dtype);
}

}  // namespace meshtrain
