// meshtrain's job configuration: torchtitan v0.2 TOML sections as plain structs. The defaults
// written here are the schema's defaults: job_config.cpp builds the schema from one table that
// binds every key to its field and reads each default from a default-constructed JobConfig.
// Every torchtitan v0.2 key is in the table; the ones meshtrain does not honour are ignored with
// a note or rejected off their default (job_config_compat.cpp), and keep no struct field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint_options.h"
#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/core/config.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/graph/passes/bucket_collectives.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/parallel/plan.h"

namespace meshtrain {

// FSDP reshard-after-forward policy; TOML accepts the torchtitan strings and true/false.
enum class ReshardAfterForward { kDefault, kAlways, kNever };
const char* reshard_after_forward_name(ReshardAfterForward r);

// The enumerated keys, parsed once in job_config.cpp. Each *_name gives the TOML spelling, which
// the effective config, `meshtrain plan` and the logs print.
enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };  // [job] device
const char* device_choice_name(DeviceChoice d);
enum class OptimizerKind : uint8_t { kAdamW };  // [optimizer] name
const char* optimizer_kind_name(OptimizerKind o);
const char* lr_decay_name(LrDecay d);  // [lr_scheduler] decay_type (the enum is optim/'s)
enum class ExpertExchange : uint8_t { kSynced, kPadded };  // [parallelism] expert_exchange
const char* expert_exchange_name(ExpertExchange e);
enum class AcMode : uint8_t { kNone, kFull, kSelective };  // [activation_checkpoint] mode
const char* ac_mode_name(AcMode m);
// [activation_checkpoint] selective_ac_option: "op" (per-op), "free" (only the cheap ops whose
// inputs the backward keeps anyway) or "N" (every N-th layer).
enum class SelectiveAcKind : uint8_t { kOp, kEveryNthLayer, kFree };
struct SelectiveAcOption {
  SelectiveAcKind kind = SelectiveAcKind::kEveryNthLayer;
  int every_n = 2;  // kEveryNthLayer only
  bool operator==(const SelectiveAcOption&) const = default;
};
std::string selective_ac_option_name(const SelectiveAcOption& o);
const char* graph_passes_name(BucketMode m);  // [compile] graph_passes (the enum is graph/'s)
const char* checkpoint_async_name(CheckpointAsync a);  // [checkpoint] async_mode (checkpoint/'s)

struct JobSection {
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool print_config = false;     // rank 0 logs the effective config (TOML) at start-up
  std::string save_config_file;  // "" = none; else JSON of the config, inside dump_folder
  DeviceChoice device = DeviceChoice::kAuto;  // the trainer resolves kAuto
  // Write rank 0's scheduled step and optimizer graphs to <dump_folder>/step_graph.txt at
  // start-up (what `meshtrain plan --dump-graph` prints).
  bool dump_graph = false;
};

struct ModelSection {
  std::string name = "llama3";  // "llama3" | "deepseek_v3"
  std::string flavor = "debugmodel";
  // A Hugging Face assets folder with tokenizer.json; "" = the byte tokenizer. torchtitan's
  // test tokenizer folder (./tests/assets/tokenizer) falls back to the byte tokenizer, with a
  // note, when absent.
  std::string hf_assets_path;
  int64_t n_layers = 0;    // 0 = the flavor's layer count
  int64_t vocab_size = 0;  // 0 = the tokenizer's vocabulary size
  // MoE models: auxiliary-loss-free load balancing step (torchtitan's MoEArgs.load_balance_coeff,
  // a model arg there; a [model] key here so runs can turn it off). 0 = off.
  double load_balance_coeff = 1e-3;
  int64_t moe_top_k = 0;  // MoE models: experts per token; 0 = the flavor's
  // MoE models: start from an all-zero router gate, so every token's scores tie and it goes to the
  // lowest-numbered experts (the rest, and the EP ranks owning them, receive nothing). For tests
  // of empty experts; training moves the gate away from zero after the first step.
  bool router_zero_init = false;
  // The output head and the cross entropy as one chunked op (ops/linear_cross_entropy.h): no
  // [tokens, vocab] logits in memory. false: ops::linear then ops::cross_entropy.
  bool fused_output_loss = true;
  int64_t output_loss_chunk_rows = ops::kDefaultChunkRows;               // its rows per chunk
  ops::AttentionKernel attention_backend = ops::AttentionKernel::kAuto;  // the CUDA kernels
  // MoE models: the CUDA kernels of the routed experts' grouped GEMMs
  ops::ExpertGemmKernel expert_gemm_backend = ops::ExpertGemmKernel::kAuto;
  // An HF config.json (or a folder holding one) whose dims the model takes instead of the
  // flavor's; "" = the flavor. [model] name must match its architecture.
  std::string hf_config;
  // Multi-token prediction (deepseek_v3 only, model/mtp.h): D modules after the main stack, and
  // the loss main + weight · mean of the D depths' losses. The weight is mtp_loss_weight for
  // steps 1..mtp_loss_weight_after_step and mtp_loss_weight_after from the next step on (the
  // report's 0.3 then 0.1); after_step 0 = one weight for the whole run.
  int64_t mtp_layers = 0;
  double mtp_loss_weight = 0.3;
  int64_t mtp_loss_weight_after_step = 0;
  double mtp_loss_weight_after = 0.1;
  double mtp_loss_weight_at(int64_t step) const;
};

struct OptimizerSection {
  OptimizerKind name = OptimizerKind::kAdamW;
  double lr = 8e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // meshtrain's: run the update on its own stream, layer by layer, so that the next step's
  // forward starts on the weights already updated (optim/optimizer.h). Bitwise the same run.
  bool overlap_next_step = false;
};

struct LRSchedulerSection {
  int64_t warmup_steps = 200;
  int64_t total_steps = -1;  // steps the schedule spans; -1 = [training] steps
  // Unset: decay starts right after warmup. Set: warmup-stable-decay, decaying over the last
  // `decay_ratio` of the steps. TOML spells unset as -1 (or by leaving the key out).
  std::optional<double> decay_ratio;
  LrDecay decay_type = LrDecay::kLinear;
  double min_lr_factor = 0.0;  // the lr never drops below lr * min_lr_factor
};

struct TrainingSection {
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;  // -1 = local_batch_size * dp degree (no accumulation)
  int64_t seq_len = 2048;
  double max_norm = 1.0;  // 0 disables gradient clipping
  // A step whose loss or gradient norm is NaN/Inf: false = stop with an error naming the step;
  // true = skip its update (masters, moments and the Adam step untouched) and go on, stopping
  // after max_consecutive_skipped_steps such steps in a row.
  bool skip_nonfinite_steps = false;
  int64_t max_consecutive_skipped_steps = 5;
  int64_t steps = 10000;
  int64_t seed = 0;  // torchtitan leaves it unset (random); meshtrain always seeds runs
  // "fortunes" | "text" | "jsonl" | "tokens", or torchtitan's "c4_test" | "c4" | "c4_validation"
  std::string dataset = "fortunes";
  std::string dataset_path;                 // "" = the dataset's default location
  std::string dataset_text_field = "text";  // jsonl: the JSON field holding a document
  // nullopt ("auto") = bfloat16 on cuda, float32 on cpu
  std::optional<DType> mixed_precision_param;
  DType mixed_precision_reduce = DType::kF32;
  DType master_dtype = DType::kF32;  // master weights and optimizer state
  // Mixed precision: the forward reads a persistent compute-dtype copy of each trainable weight
  // that the optimizer writes in its update pass; false = cast every master every micro-batch.
  bool compute_weight_copies = true;
};

struct MetricsSection {
  int64_t log_freq = 10;
  bool enable_tensorboard = false;
  std::string save_tb_folder = "tb";  // <dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM>/
  bool save_for_all_ranks = false;    // every rank writes its own rank_<r>/ events
  bool enable_jsonl = true;
};

// A held-out dataset evaluated (forward only) after every `freq`-th step and after step 1.
struct ValidationSection {
  bool enable = false;
  std::string dataset = "c4_validation";
  std::string dataset_path;  // "" = the dataset's default location
  int64_t local_batch_size = 8;
  int64_t seq_len = 2048;
  int64_t freq = 10;
  int64_t steps = -1;  // batches per validation; -1 = one pass over the whole held-out set
};

struct ParallelismSection {
  int data_parallel_replicate_degree = 1;
  int data_parallel_shard_degree = -1;  // -1 = the ranks the other degrees leave over
  ReshardAfterForward fsdp_reshard_after_forward = ReshardAfterForward::kDefault;
  int tensor_parallel_degree = 1;
  int context_parallel_degree = 1;
  int expert_parallel_degree = 1;
  int expert_tensor_parallel_degree = 1;
  double expert_capacity_factor = kDefaultExpertCapacityFactor;
  ExpertExchange expert_exchange = ExpertExchange::kSynced;  // kPadded: moe/padded_exchange.h
};

struct ActivationCheckpointSection {
  AcMode mode = AcMode::kNone;
  SelectiveAcOption selective_ac_option;  // default: every 2nd layer
  // 0 for "op" and "free" (per-op selective AC), else N.
  int selective_layer_interval() const;
};

// [compile]: the scheduling passes over the step graph (torchtitan's SimpleFSDP graph_passes).
struct CompileSection {
  // "transformer_block_bucketing" | "size_bucketing" | "none" (one collective per parameter)
  BucketMode graph_passes = BucketMode::kTransformerBlock;
  int64_t bucket_cap_mb = 25;       // size_bucketing: a bucket closes at this many MiB
  int64_t max_gathered_blocks = 2;  // blocks whose weights are gathered at once; 1 = no prefetch
};

struct ProfilingSection {
  bool enable_profiling = false;
  int64_t profile_freq = 10;
  std::string save_traces_folder = "profile_traces";
};

struct DebugSection {
  // > 0: at this step, write under <dump_folder>/debug/step-N/ the weights the step starts from
  // (an HF folder), its global gradients (gradients.safetensors, HF names), the tokens each
  // expert received and the windows it read: what an external reference needs to replay it.
  int64_t dump_step = 0;
  // On a non-finite gradient norm, name the first parameter whose gradient holds a NaN/Inf (scans
  // every gradient on the host each step: slow, for debugging).
  bool find_nonfinite_gradient = false;
  // Fault injection for tests: rank inject_*_rank, at step inject_*_step (0 = off), stalls
  // forever before the step's first collective, or writes a NaN into its first gradient.
  int64_t inject_stall_step = 0;
  int64_t inject_stall_rank = 0;
  int64_t inject_nan_step = 0;
  int64_t inject_nan_rank = 0;
};

struct CommSection {
  int64_t init_timeout_seconds = 300;
  int64_t train_timeout_seconds = 100;
};

// [checkpoint]: torchtitan's keys and defaults, the manager's options themselves
// (checkpoint/checkpoint_options.h; checkpoint/manager.h has the policy).
using CheckpointSection = CheckpointOptions;

struct JobConfig {
  JobSection job;
  ModelSection model;
  OptimizerSection optimizer;
  LRSchedulerSection lr_scheduler;
  TrainingSection training;
  MetricsSection metrics;
  ParallelismSection parallelism;
  ActivationCheckpointSection activation_checkpoint;
  CompileSection compile;
  ProfilingSection profiling;
  CommSection comm;
  ValidationSection validation;
  // Values of the keys meshtrain ignores or rejects ("section.key" -> value), set by the file or
  // the command line; they round-trip into the effective config.
  std::map<std::string, ConfigValue> unhonoured;
  // Start-up notes: one per ignored key the user set, saying what meshtrain does instead.
  std::vector<std::string> notes;
  CheckpointSection checkpoint;
  DebugSection debug;
};

// The schema of every key above, with types, ranges, choices and help.
const Schema& job_config_schema();

// Defaults < TOML file (path may be empty) < `--section.key value` overrides, then the checks
// that involve several keys. Throws ConfigError.
JobConfig parse_job_config(const std::string& path, const std::vector<std::string>& overrides);

JobConfig job_config_from_values(const ConfigValues& values);
// The struct as config values (validated): its to_toml() is the effective config of a run.
ConfigValues job_config_to_values(const JobConfig& cfg);

// Checks that involve several keys; parse_job_config calls it.
void validate_job_config(const JobConfig& cfg);
// [model] mtp_layers against the model and the sequence lengths (train/loss_parts.cpp).
void validate_mtp_config(const JobConfig& cfg);

// Micro-batches per step: global_batch_size / (local_batch_size * dp_degree), 1 when global is
// -1. ConfigError when it does not divide.
int64_t gradient_accumulation_steps(const TrainingSection& t, int64_t dp_degree);

}  // namespace meshtrain
