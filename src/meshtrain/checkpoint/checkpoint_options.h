// The [checkpoint] options with torchtitan's keys and defaults, written once: the config section is
// this struct (train/job_config.h binds each TOML key to a field) and the manager runs on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/file_dtype.h"

namespace meshtrain {

// [checkpoint] async_mode (its TOML spelling: checkpoint_async_name in train/job_config.h).
enum class CheckpointAsync : uint8_t { kDisabled, kAsync, kAsyncWithPinnedMem };

struct CheckpointOptions {
  bool enable = false;
  // In the config, relative to [job] dump_folder; the trainer resolves it before the manager
  // gets it.
  std::string folder = "checkpoint";
  int64_t interval = 500;
  int64_t keep_latest_k = 10;  // 0 = keep all; 1 is refused (the latest may be mid-save)
  int64_t load_step = -1;      // -1 = the latest
  std::string initial_load_path;
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool last_save_model_only = true;
  bool last_save_in_hf = false;
  FileDType export_dtype = FileDType::kF32;  // float16 | bfloat16 | float32
  // disabled | async | async_with_pinned_mem (= async)
  CheckpointAsync async_mode = CheckpointAsync::kDisabled;
  // Comma-separated parts of the state left at their fresh values: optimizer, lr_scheduler,
  // dataloader, train_state.
  std::string exclude_from_loading;
  bool enable_first_step_checkpoint = false;  // also save right after step 1
  bool load_only = false;                     // resume/load as usual, never save
  // A failed save (ENOSPC, EIO, ...): false = stop the run; true = log it, remove the partial
  // save, keep training and save again at the next interval.
  bool continue_on_save_error = false;

  bool async() const { return async_mode != CheckpointAsync::kDisabled; }
  std::vector<std::string> excluded() const;  // exclude_from_loading as a list, trimmed
};

}  // namespace meshtrain
