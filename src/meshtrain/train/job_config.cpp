// The job-config table: one row per TOML key binding its spec to a JobConfig field. Defaults
// come from JobConfig{} through the same member pointers, so struct and schema cannot drift.
// This file holds the keys meshtrain honours; job_config_compat.cpp the torchtitan keys it does
// not.
#include "meshtrain/train/job_config.h"

#include <functional>
#include <limits>
#include <string>

#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/core/check.h"
#include "meshtrain/train/job_config_table.h"

namespace meshtrain {

namespace job_config_detail {

Binding unhonoured(KeySpec spec) {
  Binding b;
  const std::string key = spec.section + "." + spec.name;
  const ConfigValue def = spec.default_value;
  b.spec = std::move(spec);
  b.load = [key, def](JobConfig& c, const ConfigValue& v) {
    if (v != def)
      c.unhonoured[key] = v;
    else
      c.unhonoured.erase(key);
  };
  b.store = [key, def](const JobConfig& c) -> ConfigValue {
    auto it = c.unhonoured.find(key);
    return it == c.unhonoured.end() ? def : it->second;
  };
  return b;
}

}  // namespace job_config_detail

namespace {
using namespace job_config_detail;

std::string check_selective_ac_option(const std::string& s) {
  bool positive_int = !s.empty() && s.size() < 10 &&
                      s.find_first_not_of("0123456789") == std::string::npos && std::stol(s) > 0;
  return s == "op" || s == "free" || positive_int
             ? ""
             : "\"op\", \"free\" or a positive integer such as \"2\" (every 2nd layer)";
}

// The one parse of selective_ac_option, after check_selective_ac_option accepted it.
SelectiveAcOption parse_selective_ac_option(const std::string& s) {
  if (s == "op") return {.kind = SelectiveAcKind::kOp, .every_n = 0};
  if (s == "free") return {.kind = SelectiveAcKind::kFree, .every_n = 0};
  return {.kind = SelectiveAcKind::kEveryNthLayer, .every_n = std::stoi(s)};
}

// "auto" is nullopt: the trainer picks the device's compute dtype.
const char* compute_dtype_choice_name(std::optional<DType> d) {
  return d ? dtype_name(*d) : "auto";
}

std::vector<std::string> dataset_names() {
  return {"fortunes", "text", "jsonl", "tokens", "c4_test", "c4", "c4_validation"};
}

std::vector<Binding> make_bindings() {
  using J = JobConfig;
  std::vector<Binding> t;
  // [job]
  t.push_back(field("job", "dump_folder", &J::job, &JobSection::dump_folder,
                    "Folder to dump job outputs (run folders, traces, metrics)"));
  t.push_back(
      field("job", "description", &J::job, &JobSection::description, "Description of the job"));
  t.push_back(field("job", "print_config", &J::job, &JobSection::print_config,
                    "Print the effective config (TOML) at start-up"));
  t.push_back(
      field("job", "save_config_file", &J::job, &JobSection::save_config_file,
            "Also save the effective config as JSON to this file in dump_folder; \"\" = no"));
  t.push_back(choice_field(
      "job", "device", &J::job, &JobSection::device,
      "Device to train on; auto = cuda when built with CUDA and a GPU is visible, else cpu",
      {DeviceChoice::kAuto, DeviceChoice::kCpu, DeviceChoice::kCuda}, device_choice_name));
  t.push_back(field("job", "dump_graph", &J::job, &JobSection::dump_graph,
                    "Write rank 0's scheduled step and optimizer graphs (ops, shapes, streams, "
                    "collectives, memory offsets) to <dump_folder>/step_graph.txt at start-up"));
  // [model]
  t.push_back(field("model", "name", &J::model, &ModelSection::name, "Which model to train",
                    {"llama3", "deepseek_v3"}));
  t.push_back(field("model", "flavor", &J::model, &ModelSection::flavor,
                    "Which model config (size) to train"));
  t.push_back(field("model", "hf_assets_path", &J::model, &ModelSection::hf_assets_path,
                    "Hugging Face assets folder with tokenizer.json (and tokenizer_config.json "
                    "for BOS/EOS); \"\" = byte tokenizer (torchtitan's test tokenizer path "
                    "falls back to it when absent)"));
  t.push_back(field("model", "n_layers", &J::model, &ModelSection::n_layers,
                    "Number of layers; 0 = the flavor's own (set it to cut a model for benchmarks)")
                  .at_least(0));
  t.push_back(field("model", "vocab_size", &J::model, &ModelSection::vocab_size,
                    "Vocabulary size; 0 = the tokenizer's")
                  .at_least(0));
  t.push_back(field("model", "load_balance_coeff", &J::model, &ModelSection::load_balance_coeff,
                    "MoE models: expert_bias step of auxiliary-loss-free load balancing after each "
                    "optimizer step (bias += coeff * sign(mean load - load)); 0 = off")
                  .at_least(0));
  t.push_back(field("model", "moe_top_k", &J::model, &ModelSection::moe_top_k,
                    "MoE models: experts each token is routed to; 0 = the flavor's")
                  .at_least(0));
  t.push_back(
      field("model", "router_zero_init", &J::model, &ModelSection::router_zero_init,
            "MoE models: all-zero initial router gate (every score ties, and a small random "
            "expert bias picks the experts every token goes to; for testing experts and "
            "ranks that receive nothing)"));
  t.push_back(field("model", "fused_output_loss", &J::model, &ModelSection::fused_output_loss,
                    "compute the output head and the cross entropy as one op over chunks of "
                    "rows, never holding the [tokens, vocab] logits (false: linear, then "
                    "cross_entropy)"));
  t.push_back(field("model", "output_loss_chunk_rows", &J::model,
                    &ModelSection::output_loss_chunk_rows,
                    "fused_output_loss: rows per chunk (a [chunk, vocab] float32 logits block "
                    "is the op's workspace; larger chunks mean fewer, larger GEMMs)")
                  .at_least(1));
  t.push_back(choice_field(
      "model", "attention_backend", &J::model, &ModelSection::attention_backend,
      "Which kernels run attention on CUDA: \"auto\" = cuDNN's fused attention "
      "where the build has cuDNN and it takes the shape (bf16, as many kv heads as "
      "q heads), else meshtrain's; \"cudnn\" = cuDNN or an error; \"meshtrain\" "
      "= meshtrain's own kernels. Same arithmetic up to rounding; both backwards "
      "are deterministic",
      {ops::AttentionKernel::kAuto, ops::AttentionKernel::kCudnn, ops::AttentionKernel::kMeshtrain},
      ops::attention_kernel_name));
  t.push_back(choice_field(
      "model", "expert_gemm_backend", &J::model, &ModelSection::expert_gemm_backend,
      "MoE models: which kernels run the routed experts' grouped GEMMs on CUDA: \"auto\" = "
      "meshtrain's Hopper grouped GEMM up to a mean of 768 rows per expert, cuBLASLt per "
      "expert above (the faster of the two on either side); \"cublas\" = cuBLASLt per expert; "
      "\"meshtrain\" = the Hopper grouped GEMM (group offsets read on the device, no host "
      "wait; bf16, extents multiples of 8) or an error naming the node. Same arithmetic up to "
      "rounding",
      {ops::ExpertGemmKernel::kAuto, ops::ExpertGemmKernel::kCublas,
       ops::ExpertGemmKernel::kMeshtrain},
      ops::expert_gemm_kernel_name));
  t.push_back(field("model", "hf_config", &J::model, &ModelSection::hf_config,
                    "HF config.json (or a folder holding one) giving the model's dims instead of "
                    "the flavor; \"\" = the flavor's"));
  t.push_back(field("model", "mtp_layers", &J::model, &ModelSection::mtp_layers,
                    "deepseek_v3: multi-token-prediction modules after the main stack (module k "
                    "predicts the token k + 1 ahead; block n_layers + k - 1); 0 = none. The 671B "
                    "release ships 1")
                  .at_least(0));
  t.push_back(field("model", "mtp_loss_weight", &J::model, &ModelSection::mtp_loss_weight,
                    "With mtp_layers > 0: loss = main + mtp_loss_weight x the mean of the MTP "
                    "depths' losses (0 = the MTP modules train nothing into the main model)")
                  .at_least(0));
  t.push_back(field("model", "mtp_loss_weight_after_step", &J::model,
                    &ModelSection::mtp_loss_weight_after_step,
                    "With mtp_layers > 0: steps after this one use mtp_loss_weight_after instead "
                    "of mtp_loss_weight; 0 = never")
                  .at_least(0));
  t.push_back(field("model", "mtp_loss_weight_after", &J::model,
                    &ModelSection::mtp_loss_weight_after,
                    "With mtp_layers > 0: the MTP loss weight after mtp_loss_weight_after_step")
                  .at_least(0));
  // [optimizer]
  t.push_back(choice_field("optimizer", "name", &J::optimizer, &OptimizerSection::name,
                           "Optimizer to use", {OptimizerKind::kAdamW}, optimizer_kind_name));
  t.push_back(field("optimizer", "lr", &J::optimizer, &OptimizerSection::lr, "Learning rate to use")
                  .at_least(0));
  t.push_back(field("optimizer", "beta1", &J::optimizer, &OptimizerSection::beta1,
                    "AdamW first-moment decay")
                  .in_range(0, 1));
  t.push_back(field("optimizer", "beta2", &J::optimizer, &OptimizerSection::beta2,
                    "AdamW second-moment decay")
                  .in_range(0, 1));
  t.push_back(
      field("optimizer", "eps", &J::optimizer, &OptimizerSection::eps, "Epsilon value to use")
          .at_least(0));
  t.push_back(field("optimizer", "weight_decay", &J::optimizer, &OptimizerSection::weight_decay,
                    "Weight decay to use (decoupled, AdamW)")
                  .at_least(0));
  t.push_back(field("optimizer", "overlap_next_step", &J::optimizer,
                    &OptimizerSection::overlap_next_step,
                    "Run the update on its own stream, one slice per layer, so that the next "
                    "step starts on the weights already updated while the rest are (CUDA: the "
                    "two overlap; the result is bitwise the same)"));
  // [lr_scheduler]
  t.push_back(field("lr_scheduler", "warmup_steps", &J::lr_scheduler,
                    &LRSchedulerSection::warmup_steps, "Steps of linear lr warmup")
                  .at_least(0));
  t.push_back(field("lr_scheduler", "total_steps", &J::lr_scheduler,
                    &LRSchedulerSection::total_steps,
                    "Steps the schedule spans (warmup, decay_ratio); -1 = [training] steps")
                  .at_least(1)
                  .or_sentinel(int64_t{-1}, "[training] steps"));
  {
    // decay_ratio is optional<double>: TOML has no null, so -1 stands for "unset".
    Binding b;
    b.spec = KeySpec::real("lr_scheduler", "decay_ratio", -1.0,
                           "Fraction of steps spent decaying (warmup-stable-decay); -1 = unset: "
                           "decay over all steps after warmup")
                 .in_range(0, 1)
                 .or_sentinel(-1.0, "unset");
    b.load = [](J& c, const ConfigValue& v) {
      double d = std::get<double>(v);
      c.lr_scheduler.decay_ratio = d < 0 ? std::nullopt : std::optional<double>(d);
    };
    b.store = [](const J& c) -> ConfigValue { return c.lr_scheduler.decay_ratio.value_or(-1.0); };
    t.push_back(std::move(b));
  }
  t.push_back(choice_field("lr_scheduler", "decay_type", &J::lr_scheduler,
                           &LRSchedulerSection::decay_type, "Learning rate decay shape",
                           {LrDecay::kLinear, LrDecay::kSqrt, LrDecay::kCosine}, lr_decay_name));
  t.push_back(field("lr_scheduler", "min_lr_factor", &J::lr_scheduler,
                    &LRSchedulerSection::min_lr_factor,
                    "The lr decays to lr * min_lr_factor, never below")
                  .in_range(0, 1)
                  .alias("lr_min"));
  // [training]
  t.push_back(field("training", "local_batch_size", &J::training,
                    &TrainingSection::local_batch_size,
                    "Local batch size (per data-parallel rank, per micro-batch)")
                  .at_least(1));
  t.push_back(
      field("training", "global_batch_size", &J::training, &TrainingSection::global_batch_size,
            "Global batch size; -1 = local_batch_size * dp degree; larger values accumulate "
            "gradients over global / (local * dp) micro-batches")
          .at_least(1)
          .or_sentinel(int64_t{-1}, "auto"));
  t.push_back(
      field("training", "seq_len", &J::training, &TrainingSection::seq_len, "Sequence length")
          .at_least(1));
  t.push_back(field("training", "max_norm", &J::training, &TrainingSection::max_norm,
                    "Max global gradient norm for clipping; 0 disables clipping")
                  .at_least(0));
  t.push_back(field("training", "skip_nonfinite_steps", &J::training,
                    &TrainingSection::skip_nonfinite_steps,
                    "A step whose loss or gradient norm is NaN/Inf skips its update and training "
                    "goes on (false: stop with an error naming the step)"));
  t.push_back(field("training", "max_consecutive_skipped_steps", &J::training,
                    &TrainingSection::max_consecutive_skipped_steps,
                    "With skip_nonfinite_steps: stop after this many non-finite steps in a row")
                  .at_least(1));
  t.push_back(field("training", "steps", &J::training, &TrainingSection::steps,
                    "How many train steps to run")
                  .at_least(1));
  t.push_back(
      field("training", "seed", &J::training, &TrainingSection::seed,
            "Base RNG seed for weight init and data order (default 0; runs are always seeded)")
          .at_least(0)
          .also_in("debug", "seed"));
  t.push_back(
      field("training", "dataset", &J::training, &TrainingSection::dataset,
            "Dataset: fortunes (fortune corpus), text (UTF-8 files), jsonl (JSON lines, one "
            "document per line), tokens (llm.c .bin files), or torchtitan's c4_test, c4, "
            "c4_validation (JSON lines)",
            dataset_names()));
  t.push_back(field("training", "dataset_path", &J::training, &TrainingSection::dataset_path,
                    "Dataset file or folder; \"\" = the dataset's default location"));
  t.push_back(field("training", "dataset_text_field", &J::training,
                    &TrainingSection::dataset_text_field,
                    "jsonl dataset: the string field of each line's JSON object that holds the "
                    "document"));
  t.push_back(choice_field(
      "training", "mixed_precision_param", &J::training, &TrainingSection::mixed_precision_param,
      "Dtype of parameters in forward/backward; auto = bfloat16 on cuda, float32 on cpu",
      std::vector<std::optional<DType>>{std::nullopt, DType::kBF16, DType::kF32, DType::kF64},
      compute_dtype_choice_name));
  t.push_back(choice_field("training", "mixed_precision_reduce", &J::training,
                           &TrainingSection::mixed_precision_reduce, "Dtype of gradient reductions",
                           {DType::kF32, DType::kF64, DType::kBF16}, dtype_name));
  t.push_back(
      choice_field("training", "master_dtype", &J::training, &TrainingSection::master_dtype,
                   "Dtype of master weights and optimizer state (float64 for exact parity tests)",
                   {DType::kF32, DType::kF64}, dtype_name));
  t.push_back(field("training", "compute_weight_copies", &J::training,
                    &TrainingSection::compute_weight_copies,
                    "Mixed precision (compute dtype != master_dtype): keep each trainable "
                    "weight's shard in the compute dtype too, written by the optimizer's update "
                    "pass, so the forward reads it instead of casting every master in every "
                    "micro-batch (the copies cost the compute dtype's bytes per parameter); "
                    "false = cast each micro-batch"));
  // [metrics]
  t.push_back(field("metrics", "log_freq", &J::metrics, &MetricsSection::log_freq,
                    "How often to log metrics, in steps")
                  .at_least(1));
  t.push_back(field("metrics", "enable_tensorboard", &J::metrics,
                    &MetricsSection::enable_tensorboard,
                    "Write TensorBoard event files (loss, grad_norm, lr, throughput, memory, "
                    "validation loss, expert load)"));
  t.push_back(
      field("metrics", "save_tb_folder", &J::metrics, &MetricsSection::save_tb_folder,
            "TensorBoard folder inside dump_folder (a run writes <folder>/<YYYYmmdd-HHMM>)"));
  t.push_back(field("metrics", "save_for_all_ranks", &J::metrics,
                    &MetricsSection::save_for_all_ranks,
                    "Every rank writes TensorBoard events (rank_<r>/), not only rank 0"));
  t.push_back(field("metrics", "enable_jsonl", &J::metrics, &MetricsSection::enable_jsonl,
                    "Write per-step metrics as JSON lines into the run folder"));
  // [parallelism]
  t.push_back(field("parallelism", "data_parallel_replicate_degree", &J::parallelism,
                    &ParallelismSection::data_parallel_replicate_degree,
                    "Data-parallel replicas (DDP / the replicate dim of HSDP); 1 = disabled")
                  .at_least(1));
  t.push_back(
      field("parallelism", "data_parallel_shard_degree", &J::parallelism,
            &ParallelismSection::data_parallel_shard_degree,
            "FSDP shard degree; -1 = the ranks left over by the other degrees; 1 = disabled")
          .at_least(1)
          .or_sentinel(int64_t{-1}, "auto"));
  {
    Binding b = choice_field(
        "parallelism", "fsdp_reshard_after_forward", &J::parallelism,
        &ParallelismSection::fsdp_reshard_after_forward,
        "Re-gather parameters in backward instead of keeping them from forward",
        {ReshardAfterForward::kDefault, ReshardAfterForward::kAlways, ReshardAfterForward::kNever},
        reshard_after_forward_name);
    b.spec.booleans_map_to("always", "never");
    t.push_back(std::move(b));
  }
  t.push_back(field("parallelism", "tensor_parallel_degree", &J::parallelism,
                    &ParallelismSection::tensor_parallel_degree,
                    "Tensor parallel degree; 1 = disabled")
                  .at_least(1));
  t.push_back(field("parallelism", "context_parallel_degree", &J::parallelism,
                    &ParallelismSection::context_parallel_degree,
                    "Context parallel degree; 1 = disabled")
                  .at_least(1));
  t.push_back(field("parallelism", "expert_parallel_degree", &J::parallelism,
                    &ParallelismSection::expert_parallel_degree,
                    "Expert parallel degree; 1 = disabled")
                  .at_least(1));
  t.push_back(field("parallelism", "expert_tensor_parallel_degree", &J::parallelism,
                    &ParallelismSection::expert_tensor_parallel_degree,
                    "Tensor parallel degree inside experts; 1 = disabled")
                  .at_least(1));
  t.push_back(
      field("parallelism", "expert_capacity_factor", &J::parallelism,
            &ParallelismSection::expert_capacity_factor,
            "Expert parallel: rows each rank's expert buffers are planned for, as a multiple of "
            "the rows it routes (what it receives under balanced routing); Megatron's "
            "moe_expert_capacity_factor, but dropless: a step that needs more moves its expert "
            "rows to a pool grown for it and the log says so. expert_parallel_degree (or more) "
            "plans the worst case. Default: the most any rank received in the routing measured "
            "on the DeepSeek-V3 debug model with load balancing, with headroom (README)")
          .at_least(0.1));
  t.push_back(choice_field(
      "parallelism", "expert_exchange", &J::parallelism, &ParallelismSection::expert_exchange,
      "Expert parallel token exchange. synced: each MoE layer's counts come to the host once per "
      "micro-batch and size the exchange and the grouped GEMMs exactly (one host wait per "
      "layer). padded: no host wait; each peer gets a block and each local expert a slot of "
      "expert_capacity_factor × its share of the rows, the grouped GEMMs run over whole slots "
      "(padding costs FLOPs), and a step whose rows do not fit is redone synced (dropless, "
      "logged). Padded wants a capacity factor above the routing's max/mean load",
      {ExpertExchange::kSynced, ExpertExchange::kPadded}, expert_exchange_name));
  // [activation_checkpoint]
  {
    Binding b = choice_field("activation_checkpoint", "mode", &J::activation_checkpoint,
                             &ActivationCheckpointSection::mode, "Activation checkpointing",
                             {AcMode::kNone, AcMode::kFull, AcMode::kSelective}, ac_mode_name,
                             {"memory_budget"});
    b.spec.honours_only(
        [](const ConfigValue& v) { return std::get<std::string>(v) != "memory_budget"; },
        "memory_budget is torch.compile's min-cut partitioner; meshtrain recomputes whole "
        "blocks (full) or all but matmul/attention/collective outputs (selective op)");
    t.push_back(std::move(b));
  }
  {
    static const JobConfig defaults{};
    Binding b;
    b.spec = KeySpec::string(
                 "activation_checkpoint", "selective_ac_option",
                 selective_ac_option_name(defaults.activation_checkpoint.selective_ac_option),
                 "Selective AC: \"op\" for per-op (recompute every op but matmuls, attention "
                 "and collectives), \"free\" (recompute only such ops whose inputs the "
                 "backward keeps anyway: no memory added, far fewer ops than \"op\"), or \"N\" "
                 "to checkpoint every N-th layer")
                 .accepts_integers()
                 .validated_by(check_selective_ac_option);
    b.load = [](J& c, const ConfigValue& v) {
      c.activation_checkpoint.selective_ac_option =
          parse_selective_ac_option(std::get<std::string>(v));
    };
    b.store = [](const J& c) -> ConfigValue {
      return selective_ac_option_name(c.activation_checkpoint.selective_ac_option);
    };
    t.push_back(std::move(b));
  }
  // [compile]
  {
    Binding b =
        choice_field("compile", "graph_passes", &J::compile, &CompileSection::graph_passes,
                     "Scheduling passes (SimpleFSDP's graph_passes): bucket the FSDP gathers and "
                     "reduce-scatters per transformer block, or by size (bucket_cap_mb), and "
                     "prefetch them max_gathered_blocks - 1 blocks ahead; none = one collective "
                     "per parameter in program order",
                     {BucketMode::kTransformerBlock, BucketMode::kSize, BucketMode::kNone},
                     graph_passes_name, {"auto_bucketing"});
    b.spec.honours_only(
        [](const ConfigValue& v) { return std::get<std::string>(v) != "auto_bucketing"; },
        "auto_bucketing is torch.compile's estimator-driven bucketing; meshtrain buckets per "
        "transformer block (transformer_block_bucketing) or by size (size_bucketing)");
    t.push_back(std::move(b));
  }
  t.push_back(field("compile", "bucket_cap_mb", &J::compile, &CompileSection::bucket_cap_mb,
                    "size_bucketing: close a bucket once it holds this many MiB")
                  .at_least(1));
  t.push_back(field("compile", "max_gathered_blocks", &J::compile,
                    &CompileSection::max_gathered_blocks,
                    "Blocks whose weights are gathered at once: the next block's gather is issued "
                    "max_gathered_blocks - 1 blocks ahead of its compute; 1 = no prefetch")
                  .at_least(1));
  // [profiling]
  t.push_back(field("profiling", "enable_profiling", &J::profiling,
                    &ProfilingSection::enable_profiling, "Whether to collect profiler traces"));
  t.push_back(field("profiling", "profile_freq", &J::profiling, &ProfilingSection::profile_freq,
                    "How often to collect profiler traces, in steps")
                  .at_least(1));
  t.push_back(field("profiling", "save_traces_folder", &J::profiling,
                    &ProfilingSection::save_traces_folder, "Trace folder, inside the run folder"));
  // [comm]
  t.push_back(field("comm", "init_timeout_seconds", &J::comm, &CommSection::init_timeout_seconds,
                    "Timeout for collectives during initialisation and the first step")
                  .at_least(1));
  t.push_back(field("comm", "train_timeout_seconds", &J::comm, &CommSection::train_timeout_seconds,
                    "Timeout for collectives after the first step")
                  .at_least(1));
  // [validation]
  t.push_back(field("validation", "enable", &J::validation, &ValidationSection::enable,
                    "Evaluate the loss on a held-out dataset (forward only) every freq steps"));
  t.push_back(field("validation", "dataset", &J::validation, &ValidationSection::dataset,
                    "Held-out dataset (the same kinds as [training] dataset)", dataset_names()));
  t.push_back(field("validation", "dataset_path", &J::validation, &ValidationSection::dataset_path,
                    "Held-out dataset file or folder; \"\" = the dataset's default location"));
  t.push_back(field("validation", "local_batch_size", &J::validation,
                    &ValidationSection::local_batch_size,
                    "Validation batch size per data-parallel rank")
                  .at_least(1));
  t.push_back(field("validation", "seq_len", &J::validation, &ValidationSection::seq_len,
                    "Validation sequence length")
                  .at_least(1));
  t.push_back(field("validation", "freq", &J::validation, &ValidationSection::freq,
                    "Validate after step 1 and every freq steps")
                  .at_least(1));
  t.push_back(field("validation", "steps", &J::validation, &ValidationSection::steps,
                    "Batches per validation (continuing through the held-out set); -1 = all of it")
                  .at_least(1)
                  .or_sentinel(int64_t{-1}, "one pass over all of it"));
  // [checkpoint]
  using C = CheckpointSection;
  t.push_back(field("checkpoint", "enable", &J::checkpoint, &C::enable,
                    "Save checkpoints, and resume from the latest one in the folder")
                  .alias("enable_checkpoint"));
  t.push_back(field("checkpoint", "folder", &J::checkpoint, &C::folder,
                    "Checkpoint folder, inside [job] dump_folder"));
  t.push_back(field("checkpoint", "interval", &J::checkpoint, &C::interval,
                    "Checkpointing interval, in steps")
                  .at_least(1));
  t.push_back(field("checkpoint", "keep_latest_k", &J::checkpoint, &C::keep_latest_k,
                    "Keep only the latest k checkpoints (0 = all; 1 is not allowed)")
                  .at_least(0));
  t.push_back(field("checkpoint", "load_step", &J::checkpoint, &C::load_step,
                    "Load the checkpoint of this step; -1 = the latest")
                  .at_least(0)
                  .or_sentinel(int64_t{-1}, "the latest"));
  t.push_back(field("checkpoint", "initial_load_path", &J::checkpoint, &C::initial_load_path,
                    "Checkpoint (step folder) to start from when the folder holds none"));
  t.push_back(field("checkpoint", "initial_load_model_only", &J::checkpoint,
                    &C::initial_load_model_only,
                    "Load only the model from initial_load_path (else the full training state)")
                  .alias("initial_load_model_weights_only"));
  t.push_back(field("checkpoint", "initial_load_in_hf", &J::checkpoint, &C::initial_load_in_hf,
                    "initial_load_path is a Hugging Face folder (safetensors + config.json)"));
  t.push_back(field("checkpoint", "last_save_model_only", &J::checkpoint, &C::last_save_model_only,
                    "The save at the last step holds only the model, in export_dtype")
                  .alias("last_save_model_weights_only"));
  t.push_back(field("checkpoint", "last_save_in_hf", &J::checkpoint, &C::last_save_in_hf,
                    "The save at the last step is in Hugging Face layout"));
  t.push_back(choice_field("checkpoint", "export_dtype", &J::checkpoint, &C::export_dtype,
                           "Dtype of the model-only last save",
                           {FileDType::kF16, FileDType::kBF16, FileDType::kF32}, torch_dtype_name));
  t.push_back(choice_field(
      "checkpoint", "async_mode", &J::checkpoint, &C::async_mode,
      "disabled = the step loop waits for saves; async = only for the host "
      "snapshot, files are written in the background",
      {CheckpointAsync::kDisabled, CheckpointAsync::kAsync, CheckpointAsync::kAsyncWithPinnedMem},
      checkpoint_async_name));
  {
    Binding b =
        field("checkpoint", "exclude_from_loading", &J::checkpoint, &C::exclude_from_loading,
              "Comma-separated parts left fresh on resume: optimizer, lr_scheduler, "
              "dataloader, train_state");
    b.spec.accepts_string_arrays().validated_by([](const std::string& v) {
      for (const std::string& part : CheckpointSection{.exclude_from_loading = v}.excluded())
        if (part != "optimizer" && part != "lr_scheduler" && part != "dataloader" &&
            part != "train_state")
          return std::string(
              "a comma-separated list of optimizer, lr_scheduler, dataloader, train_state");
      return std::string();
    });
    t.push_back(std::move(b));
  }
  t.push_back(field("checkpoint", "enable_first_step_checkpoint", &J::checkpoint,
                    &C::enable_first_step_checkpoint,
                    "Also save right after step 1 (checks that checkpointing works early)"));
  t.push_back(field("checkpoint", "load_only", &J::checkpoint, &C::load_only,
                    "Load checkpoints as usual but never save one"));
  t.push_back(field("checkpoint", "continue_on_save_error", &J::checkpoint,
                    &C::continue_on_save_error,
                    "A failed save (disk full, I/O error) is logged and training goes on, saving "
                    "again at the next interval (false: the run stops)"));
  // [debug]
  t.push_back(field("debug", "dump_step", &J::debug, &DebugSection::dump_step,
                    "Write the weights (HF folder), global gradients and expert loads of this step "
                    "under <dump_folder>/debug/step-N (for an external reference); 0 = off")
                  .at_least(0));
  t.push_back(field("debug", "find_nonfinite_gradient", &J::debug,
                    &DebugSection::find_nonfinite_gradient,
                    "On a non-finite gradient norm, name the first parameter whose gradient is "
                    "NaN/Inf (scans gradients on the host every step)"));
  t.push_back(field("debug", "inject_stall_step", &J::debug, &DebugSection::inject_stall_step,
                    "Fault injection: inject_stall_rank stalls forever at this step; 0 = off")
                  .at_least(0));
  t.push_back(field("debug", "inject_stall_rank", &J::debug, &DebugSection::inject_stall_rank,
                    "Fault injection: the rank that stalls")
                  .at_least(0));
  t.push_back(field("debug", "inject_nan_step", &J::debug, &DebugSection::inject_nan_step,
                    "Fault injection: inject_nan_rank writes a NaN into its first gradient at "
                    "this step; 0 = off")
                  .at_least(0));
  t.push_back(field("debug", "inject_nan_rank", &J::debug, &DebugSection::inject_nan_rank,
                    "Fault injection: the rank whose gradient gets the NaN")
                  .at_least(0));
  add_unhonoured_rows(t);
  return t;
}

const std::vector<Binding>& bindings() {
  static const std::vector<Binding> table = make_bindings();
  return table;
}

}  // namespace

const Schema& job_config_schema() {
  static const Schema schema = [] {
    Schema s;
    for (const Binding& b : bindings()) s.add(b.spec);
    return s;
  }();
  return schema;
}

JobConfig job_config_from_values(const ConfigValues& values) {
  JobConfig c;
  for (const Binding& b : bindings()) b.load(c, values.get(b.spec.section, b.spec.name));
  c.notes = values.ignored_notes();
  return c;
}

ConfigValues job_config_to_values(const JobConfig& cfg) {
  ConfigValues v(job_config_schema());
  // Where a value came from is lost in the struct; a value off its default counts as overridden.
  for (const Binding& b : bindings()) {
    ConfigValue value = b.store(cfg);
    if (value != v.get(b.spec.section, b.spec.name))
      v.set(b.spec.section, b.spec.name, std::move(value), ValueSource::kOverride);
  }
  return v;
}

namespace {
void validate_checkpoint(const CheckpointSection& k) {
  MT_CHECK_T(ConfigError, k.keep_latest_k != 1,
             "[checkpoint] keep_latest_k must be 0 (keep all) or at least 2, found 1: the latest "
             "checkpoint may still be in the middle of its save");
  MT_CHECK_T(ConfigError, !k.last_save_in_hf || k.last_save_model_only,
             "[checkpoint] last_save_in_hf = true needs last_save_model_only = true: a Hugging "
             "Face folder holds only the model");
  MT_CHECK_T(ConfigError, !k.initial_load_in_hf || k.initial_load_model_only,
             "[checkpoint] initial_load_in_hf = true needs initial_load_model_only = true: a "
             "Hugging Face folder holds only the model");
}
}  // namespace

void validate_job_config(const JobConfig& c) {
  validate_checkpoint(c.checkpoint);
  validate_mtp_config(c);
  const TrainingSection& t = c.training;
  if (t.global_batch_size != -1 && t.global_batch_size % t.local_batch_size != 0)
    MT_THROW(ConfigError,
             "[training] global_batch_size must be a multiple of [training] local_batch_size "
             "(times the data-parallel degree), found {} and {}",
             t.global_batch_size, t.local_batch_size);
  if (t.mixed_precision_param == DType::kF64 && t.master_dtype != DType::kF64)
    MT_THROW(ConfigError,
             "[training] mixed_precision_param float64 needs [training] master_dtype float64, "
             "found master_dtype {}",
             dtype_name(t.master_dtype));
}

JobConfig parse_job_config(const std::string& path, const std::vector<std::string>& overrides) {
  JobConfig c = job_config_from_values(load_config(job_config_schema(), path, overrides));
  validate_job_config(c);
  return c;
}

int64_t gradient_accumulation_steps(const TrainingSection& t, int64_t dp_degree) {
  MT_CHECK(dp_degree >= 1, "dp degree must be >= 1, found {}", dp_degree);
  if (t.global_batch_size == -1) return 1;
  int64_t per_micro = t.local_batch_size * dp_degree;
  if (t.global_batch_size % per_micro != 0)
    MT_THROW(
        ConfigError,
        "[training] global_batch_size {} must be a multiple of local_batch_size x data-parallel "
        "degree = {} x {} = {}",
        t.global_batch_size, t.local_batch_size, dp_degree, per_micro);
  return t.global_batch_size / per_micro;
}

}  // namespace meshtrain
