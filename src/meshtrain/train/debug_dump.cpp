// The debug dump of one step: the HF save of the masters and of the gradients (every rank its own
// rows), then two small JSON files from rank 0.
#include "meshtrain/train/debug_dump.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace fs = std::filesystem;

DebugDump::DebugDump(const std::string& dump_folder, int64_t step)
    : step_(step),
      folder_(step > 0 ? (fs::path(dump_folder) / "debug" / fmt::format("step-{}", step)).string()
                       : std::string()) {}

void DebugDump::weights(const HfRunContext& run) const {
  if (run.world_rank == 0) fs::create_directories(folder_);
  save_hf_from_store((fs::path(folder_) / "model").string(), run, {});
}

void DebugDump::gradients(const HfRunContext& run) const {
  save_hf_from_store(folder_, run, {.what = HfSaveWhat::kGradients});
}

void DebugDump::summary(
    const DumpStepInfo& i,
    const std::vector<std::pair<std::string, std::vector<double>>>& loads) const {
  nlohmann::ordered_json d;
  d["step"] = i.step;
  d["seq_len"] = i.seq_len;
  d["rows_per_step"] = i.rows_per_step;
  d["window_begin"] = i.window_begin;
  d["windows_per_epoch"] = i.windows_per_epoch;
  d["dataset"] = i.dataset;
  d["loss"] = i.loss;
  d["grad_norm"] = i.grad_norm;
  d["lr"] = i.lr;
  write_file_durably((fs::path(folder_) / "dump.json").string(), d.dump(1) + "\n");
  nlohmann::ordered_json l = nlohmann::ordered_json::object();
  for (const auto& [layer, tokens] : loads) l[layer] = tokens;
  write_file_durably((fs::path(folder_) / "moe_load.json").string(), l.dump() + "\n");
  log_info("debug dump of step {}: {}", i.step, folder_);
}

}  // namespace meshtrain
