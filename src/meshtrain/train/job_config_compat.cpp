// The torchtitan v0.2 (v0.2.0 to v0.2.2) keys meshtrain recognises but does not honour. An ignored
// key never changes a result (its note says what meshtrain does instead); a rejected key would,
// so any value but the one meshtrain honours is an error that says why.
#include "meshtrain/train/job_config_table.h"

namespace meshtrain::job_config_detail {
namespace {

bool is_true(const ConfigValue& v) { return std::get<bool>(v); }

struct Rows {
  std::vector<Binding>& t;
  void ignored(KeySpec spec, std::string note) {
    t.push_back(unhonoured(std::move(spec.ignored(std::move(note)))));
  }
  void ignored_with(KeySpec spec, std::function<std::string(const ConfigValue&)> note) {
    t.push_back(unhonoured(std::move(spec.ignored_with(std::move(note)))));
  }
  void rejected(KeySpec spec, std::string why) {
    t.push_back(unhonoured(std::move(spec.rejected(std::move(why)))));
  }
};

using K = KeySpec;

const char* kPipelineOnly =
    "used only with pipeline parallelism, which meshtrain rejects (pipeline_parallel_degree 1)";
const char* kContextOnly =
    "used only with context parallelism (context_parallel_degree > 1 is not implemented)";
const char* kFloat8Only =
    "tunes float8 training ([model] converters), which meshtrain does not implement";
const char* kMxOnly = "tunes MX training ([model] converters), which meshtrain does not implement";
const char* kFtOnly = "used only with [fault_tolerance] enable, which meshtrain rejects";
const char* kNoWorkers =
    "meshtrain's loader tokenizes once at start-up and fills each batch in the training "
    "process, allocation-free (no worker processes)";

std::string deterministic_note(const ConfigValue& v) {
  return is_true(v) ? "meshtrain's step is always deterministic (fixed reduction orders, no "
                      "atomics in reductions): nothing to switch on"
                    : "meshtrain's step is deterministic regardless (fixed reduction orders, no "
                      "atomics in reductions); false does not trade that for speed";
}

void dataloader_rows(Rows& r, const std::string& section) {
  r.ignored(K::integer(section, "num_workers", 0, "Data loader worker processes"), kNoWorkers);
  r.ignored(K::boolean(section, "persistent_workers", false, "Keep workers between epochs"),
            kNoWorkers);
  r.ignored(K::boolean(section, "pin_memory", false, "Pinned host batches"),
            "batches are staged in pinned buffers on a GPU whatever this says");
  r.ignored(K::integer(section, "prefetch_factor", -1, "Batches each worker loads ahead")
                .or_sentinel(int64_t{-1}, "unset"),
            kNoWorkers);
}

}  // namespace

void add_unhonoured_rows(std::vector<Binding>& table) {
  Rows r{table};
  // [job]
  r.ignored(K::string("job", "config_file", "", "Config file (torchtitan's --job.config_file)"),
            "the config file is the one named by --config (or --job.config_file) on the command "
            "line");
  r.rejected(K::string("job", "custom_config_module", "", "Python module extending JobConfig"),
             "meshtrain's config schema is fixed (no Python extensions): the keys such a module "
             "adds are unknown here");
  // [profiling]
  r.ignored(K::integer("profiling", "profiler_active", 1, "Steps each profiling cycle traces"),
            "meshtrain traces one whole step every profile_freq steps");
  r.ignored(K::integer("profiling", "profiler_warmup", 3, "Warm-up steps before a traced step"),
            "no profiler warm-up is needed: the step graph and its memory are fixed before step 1");
  const char* kNoSnapshot =
      "device memory is planned before step 1: `meshtrain plan` prints the plan and every log "
      "line the peak";
  r.ignored(K::boolean("profiling", "enable_memory_snapshot", false, "Dump memory snapshots"),
            kNoSnapshot);
  r.ignored(K::string("profiling", "save_memory_snapshot_folder", "memory_snapshot",
                      "Memory snapshot folder"),
            kNoSnapshot);
  // [metrics]
  r.ignored(K::boolean("metrics", "disable_color_printing", false, "No colours in the log"),
            "meshtrain's log has no colours");
  r.ignored(K::boolean("metrics", "enable_wandb", false, "Log to Weights & Biases"),
            "Weights & Biases is not built in: metrics go to metrics.jsonl and, with "
            "enable_tensorboard, to TensorBoard");
  // [model]
  r.ignored(K::string("model", "tokenizer_path", "", "Deprecated: use hf_assets_path"),
            "deprecated (and unused) in torchtitan v0.2: the tokenizer comes from [model] "
            "hf_assets_path");
  r.rejected(K::list("model", "converters", {}, "Model converters (float8, mx, ...)"),
             "model converters (float8, mx) change the GEMM numerics; meshtrain computes in "
             "[training] mixed_precision_param");
  r.ignored(K::boolean("model", "print_after_conversion", false, "Print the converted model"),
            "meshtrain applies no converters; the model summary is printed at start-up");
  // [optimizer]
  r.ignored(K::choice("optimizer", "implementation", {"for-loop", "foreach", "fused"}, "fused",
                      "PyTorch optimizer implementation"),
            "meshtrain's AdamW is one fused pass over flat per-group buffers");
  r.rejected(K::boolean("optimizer", "early_step_in_backward", false, "Optimizer in backward"),
             "meshtrain steps the optimizer after the whole backward and the global-norm clip; "
             "stepping during backward would skip the clip");
  // [training]
  r.ignored(K::boolean("training", "enable_cpu_offload", false, "FSDP CPU offload"),
            "parameters, gradients and optimizer state stay on the device (planned before step 1)");
  r.rejected(K::choice("training", "dtype", {"bfloat16", "float32"}, "float32",
                       "Training dtype (bfloat16 = no float32 master copy)"),
             "training entirely in bfloat16 is not implemented: master weights and optimizer "
             "state are in [training] master_dtype (float32 or float64)");
  r.ignored(K::integer("training", "gc_freq", 50, "Python garbage collection interval"),
            "there is no garbage collector: every buffer is planned once");
  r.ignored(K::boolean("training", "gc_debug", false, "Python garbage collection debugging"),
            "there is no garbage collector: every buffer is planned once");
  r.ignored_with(K::boolean("training", "deterministic", false, "Deterministic algorithms"),
                 deterministic_note);
  r.rejected(K::boolean("training", "debug_moe_force_load_balance", false,
                        "Round-robin expert routing (debugging)")
                 .also_in("debug", "moe_force_load_balance"),
             "round-robin expert routing is not implemented: it routes tokens differently "
             "([model] router_zero_init is meshtrain's test-only routing)");
  dataloader_rows(r, "training.dataloader");
  // [parallelism]
  r.ignored(K::boolean("parallelism", "enable_compiled_autograd", false, "Compiled autograd"),
            "the backward is part of the one compiled step graph");
  r.ignored(K::boolean("parallelism", "disable_loss_parallel", false, "No loss parallel"),
            "each rank computes the loss of its token shard over the full vocabulary (no "
            "vocabulary-parallel loss); the result is the same");
  r.ignored(K::boolean("parallelism", "enable_async_tensor_parallel", false, "Async TP"),
            "TP collectives run on their own stream, ordered by the step graph; no separate mode");
  r.rejected(K::integer("parallelism", "pipeline_parallel_degree", 1, "Pipeline parallel degree"),
             "pipeline parallelism is not implemented; use data_parallel_shard_degree, "
             "tensor_parallel_degree or expert_parallel_degree");
  r.ignored(
      K::list("parallelism", "module_fqns_per_model_part", {}, "Modules of each PP stage").nested(),
      kPipelineOnly);
  r.ignored(K::integer("parallelism", "pipeline_parallel_first_stage_less_layers", 1,
                       "Layers fewer in the first stage"),
            kPipelineOnly);
  r.ignored(K::integer("parallelism", "pipeline_parallel_last_stage_less_layers", 1,
                       "Layers fewer in the last stage"),
            kPipelineOnly);
  r.ignored(K::integer("parallelism", "pipeline_parallel_layers_per_stage", -1,
                       "Layers per pipeline stage")
                .or_sentinel(int64_t{-1}, "unset"),
            kPipelineOnly);
  r.ignored(K::string("parallelism", "pipeline_parallel_schedule", "1F1B", "Pipeline schedule"),
            kPipelineOnly);
  r.ignored(K::string("parallelism", "pipeline_parallel_schedule_csv", "", "Schedule CSV file"),
            kPipelineOnly);
  r.ignored(
      K::integer("parallelism", "pipeline_parallel_microbatch_size", 1, "Pipeline microbatch size"),
      kPipelineOnly);
  r.ignored(K::boolean("parallelism", "pipeline_parallel_expert_parallel_overlap", true,
                       "Overlap EP and PP communication (DualPipeV)"),
            kPipelineOnly);
  r.ignored(K::choice("parallelism", "context_parallel_rotate_method", {"allgather", "alltoall"},
                      "allgather", "CP key/value exchange"),
            kContextOnly);
  r.ignored(
      K::string("parallelism", "context_parallel_load_balancer", "headtail", "CP load balancer"),
      kContextOnly);
  r.ignored(K::choice("parallelism", "expert_parallel_comm_backend", {"standard", "deepep"},
                      "standard", "Expert-parallel token exchange"),
            "meshtrain's token exchange is its own all_to_all_v (no DeepEP kernels); the result "
            "is the same");
  // [activation_checkpoint]
  r.ignored(K::list("activation_checkpoint", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                    {"moe.router.gate"}, "Matmuls always recomputed by per-op SAC"),
            "meshtrain's per-op policy is fixed: it saves every matmul, attention and collective "
            "output (memory only, never results)");
  r.ignored(K::boolean("activation_checkpoint", "early_stop", false, "Stop recompute early"),
            "recomputed blocks are cloned into the backward graph once; nothing to stop");
  r.ignored(K::real("activation_checkpoint", "memory_budget", 0.5, "Budget for memory_budget"),
            "used only by mode memory_budget, which meshtrain rejects");
  r.ignored(K::boolean("activation_checkpoint", "visualize_memory_budget_pareto", false,
                       "Pareto plot of memory_budget"),
            "used only by mode memory_budget, which meshtrain rejects");
  r.ignored(K::boolean("activation_checkpoint", "preserve_rng_state", true, "Save RNG state"),
            "the step has no random ops: recomputation is exact without RNG state");
  r.ignored(K::string("activation_checkpoint", "determinism_check", "default", "Recompute check"),
            "recomputed values equal the originals by construction (same kernels, same inputs)");
  r.ignored(K::boolean("activation_checkpoint", "debug", false, "Capture AC debug information"),
            "`meshtrain plan` prints how many nodes each block recomputes");
  // [compile]
  const char* kCompiled = "the whole step is always compiled into one graph";
  r.ignored(K::boolean("compile", "enable", false, "torch.compile"), kCompiled);
  r.ignored(K::list("compile", "components", {"model", "loss"}, "What to compile"), kCompiled);
  r.ignored(K::string("compile", "backend", "inductor", "torch.compile backend"),
            "meshtrain runs its own kernels (no torch.compile backend)");
  // [quantize.*]
  const std::string f8 = "quantize.linear.float8";
  r.ignored(K::boolean(f8, "enable_fsdp_float8_all_gather", false, "float8 FSDP all-gather"),
            kFloat8Only);
  r.ignored(K::boolean(f8, "precompute_float8_dynamic_scale_for_fsdp", false,
                       "Precompute float8 scales for FSDP"),
            kFloat8Only);
  r.rejected(K::string(f8, "recipe_name", "", "float8 recipe (tensorwise, rowwise, ...)"),
             "float8 training recipes are not implemented: meshtrain's GEMMs run in [training] "
             "mixed_precision_param");
  r.ignored(K::list(f8, "filter_fqns", {}, "Modules float8 skips"), kFloat8Only);
  r.ignored(K::boolean(f8, "emulate", false, "Emulate float8 GEMMs"), kFloat8Only);
  r.ignored(K::list("quantize.grouped_mm.float8", "fqns", {}, "MoE modules with float8 GEMMs")
                .or_string(),
            kFloat8Only);
  const std::string mx = "quantize.linear.mx";
  r.ignored(K::choice(mx, "mxfp8_dim1_cast_kernel_choice", {"triton", "cuda", "torch"}, "triton",
                      "MXFP8 cast kernel"),
            kMxOnly);
  r.rejected(K::string(mx, "recipe_name", "mxfp8_cublas", "MX recipe"),
             "MX training recipes are not implemented: meshtrain's GEMMs run in [training] "
             "mixed_precision_param");
  r.ignored(K::list(mx, "filter_fqns", {"output"}, "Modules MX skips"), kMxOnly);
  r.ignored(K::choice("quantize.grouped_mm.mx", "recipe_name", {"mxfp8"}, "mxfp8",
                      "MX grouped-GEMM recipe"),
            kMxOnly);
  r.ignored(K::list("quantize.grouped_mm.mx", "fqns", {}, "MoE modules with MX GEMMs").or_string(),
            kMxOnly);
  // [checkpoint] (the keys meshtrain honours are in job_config.cpp)
  r.ignored(K::boolean("checkpoint", "enable_ft_dataloader_checkpoints", true,
                       "Data loader checkpoints for torchft replicas"),
            kFtOnly);
  r.ignored(K::boolean("checkpoint", "initial_load_in_hf_quantized", false,
                       "The HF checkpoint holds quantised weights"),
            "FP8 block-quantised Hugging Face weights are recognised by their weight_scale_inv "
            "tensors and dequantised while loading, whatever this says");
  r.rejected(
      K::boolean("checkpoint", "create_seed_checkpoint", false,
                 "Write an initial checkpoint on one rank and exit"),
      "meshtrain initialises each shard from (seed, name, global index), so every layout "
      "starts from the same weights without a seed checkpoint (use enable_first_step_checkpoint "
      "for an early checkpoint)");
  // [comm]
  const char* kNoRecorder =
      "no flight recorder: a collective that exceeds the [comm] timeouts fails with an error";
  r.ignored(K::integer("comm", "trace_buf_size", 20000, "Flight recorder buffer size"),
            kNoRecorder);
  r.ignored(K::string("comm", "save_traces_folder", "comm_traces", "Flight recorder folder"),
            kNoRecorder);
  r.ignored(K::string("comm", "save_traces_file_prefix", "rank_", "Flight recorder file prefix"),
            kNoRecorder);
  r.rejected(K::choice("comm", "mode", {"default", "fake_backend", "local_tensor"}, "default",
                       "Communication mode"),
             "meshtrain's dry run is `meshtrain plan --world N --rank R`; there is no fake or "
             "local-tensor backend");
  // [memory_estimation]
  const char* kPlan = "`meshtrain plan` prints a rank's planned memory; train logs it at start-up";
  r.ignored(K::boolean("memory_estimation", "enable", false, "Estimate FSDP memory"), kPlan);
  r.ignored(K::boolean("memory_estimation", "disable_fake_mode", false, "No FakeTensorMode"),
            kPlan);
  // [fault_tolerance]
  r.rejected(K::boolean("fault_tolerance", "enable", false, "TorchFT fault tolerance"),
             "TorchFT is not implemented (replica groups cannot join or leave a run)");
  r.ignored(K::string("fault_tolerance", "process_group", "gloo", "TorchFT process group"),
            kFtOnly);
  r.ignored(K::integer("fault_tolerance", "process_group_timeout_ms", 10000, "TorchFT timeout"),
            kFtOnly);
  r.ignored(K::integer("fault_tolerance", "replica_id", 0, "TorchFT replica id"), kFtOnly);
  r.ignored(K::integer("fault_tolerance", "group_size", 0, "TorchFT replica groups"), kFtOnly);
  r.ignored(K::integer("fault_tolerance", "min_replica_size", 1, "TorchFT minimum replicas"),
            kFtOnly);
  r.ignored(K::string("fault_tolerance", "semi_sync_method", "", "local_sgd or diloco"), kFtOnly);
  // [experimental]
  const char* kNoPython = "meshtrain cannot import Python modules; its models are built in";
  r.rejected(K::string("experimental", "custom_import", "", "Module to import"), kNoPython);
  r.rejected(K::string("experimental", "custom_args_module", "", "Deprecated JobConfig extension"),
             kNoPython);
  // [validation.dataloader]
  dataloader_rows(r, "validation.dataloader");
  // [debug] (torchtitan v0.2.2 moved seed, deterministic and moe_force_load_balance here; seed
  // and moe_force_load_balance are also names of their [training] keys)
  r.ignored_with(K::boolean("debug", "deterministic", false, "Deterministic algorithms"),
                 deterministic_note);
  r.ignored(K::boolean("debug", "deterministic_warn_only", false, "Warn on nondeterminism"),
            "nothing to warn about: meshtrain's kernels are deterministic");
}

}  // namespace meshtrain::job_config_detail
