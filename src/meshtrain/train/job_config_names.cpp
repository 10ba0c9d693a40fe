// The TOML spelling of each enumerated job-config value ([job] device, [compile] graph_passes,
// ...): the one name function per enum, which the config table parses through and the effective
// config, `meshtrain plan` and the logs print.
#include <string>

#include "meshtrain/train/job_config.h"

namespace meshtrain {

const char* reshard_after_forward_name(ReshardAfterForward r) {
  switch (r) {
    case ReshardAfterForward::kDefault: return "default";
    case ReshardAfterForward::kAlways: return "always";
    case ReshardAfterForward::kNever: return "never";
  }
  return "default";
}

const char* device_choice_name(DeviceChoice d) {
  switch (d) {
    case DeviceChoice::kAuto: return "auto";
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
  }
  return "auto";
}

const char* optimizer_kind_name(OptimizerKind) { return "AdamW"; }

const char* lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::kLinear: return "linear";
    case LrDecay::kSqrt: return "sqrt";
    case LrDecay::kCosine: return "cosine";
  }
  return "linear";
}

const char* expert_exchange_name(ExpertExchange e) {
  return e == ExpertExchange::kPadded ? "padded" : "synced";
}

const char* ac_mode_name(AcMode m) {
  switch (m) {
    case AcMode::kNone: return "none";
    case AcMode::kFull: return "full";
    case AcMode::kSelective: return "selective";
  }
  return "none";
}

std::string selective_ac_option_name(const SelectiveAcOption& o) {
  if (o.kind == SelectiveAcKind::kOp) return "op";
  if (o.kind == SelectiveAcKind::kFree) return "free";
  return std::to_string(o.every_n);
}

const char* graph_passes_name(BucketMode m) {
  switch (m) {
    case BucketMode::kTransformerBlock: return "transformer_block_bucketing";
    case BucketMode::kSize: return "size_bucketing";
    case BucketMode::kNone: return "none";
  }
  return "none";
}

const char* checkpoint_async_name(CheckpointAsync a) {
  switch (a) {
    case CheckpointAsync::kDisabled: return "disabled";
    case CheckpointAsync::kAsync: return "async";
    case CheckpointAsync::kAsyncWithPinnedMem: return "async_with_pinned_mem";
  }
  return "disabled";
}

int ActivationCheckpointSection::selective_layer_interval() const {
  return selective_ac_option.kind == SelectiveAcKind::kEveryNthLayer ? selective_ac_option.every_n
                                                                     : 0;
}

}  // namespace meshtrain
