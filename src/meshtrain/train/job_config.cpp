// The job-config table: one row per TOML key binding its spec to a JobConfig field. Defaults
// come from JobConfig{} through the same member pointers, so struct and schema cannot drift.
#include "meshtrain/train/job_config.h"

#include <functional>
#include <limits>
#include <string>

#include "meshtrain/core/check.h"

namespace meshtrain {

const char* reshard_after_forward_name(ReshardAfterForward r) {
  switch (r) {
    case ReshardAfterForward::kDefault: return "default";
    case ReshardAfterForward::kAlways: return "always";
    case ReshardAfterForward::kNever: return "never";
  }
  return "default";
}

int ActivationCheckpointSection::selective_layer_interval() const {
  return selective_ac_option == "op" ? 0 : std::stoi(selective_ac_option);
}

namespace {

struct Binding {
  KeySpec spec;
  std::function<void(JobConfig&, const ConfigValue&)> load;
  std::function<ConfigValue(const JobConfig&)> store;

  Binding& at_least(double v) {
    spec.at_least(v);
    return *this;
  }
  Binding& in_range(double lo, double hi) {
    spec.in_range(lo, hi);
    return *this;
  }
  Binding& or_sentinel(ConfigValue v, std::string meaning) {
    spec.or_sentinel(std::move(v), std::move(meaning));
    return *this;
  }
  Binding& alias(std::string a) {
    spec.alias(std::move(a));
    return *this;
  }
};

// A plain field: int, int64_t, double, bool or std::string (a free string, or a choice when
// `choices` is non-empty). The schema default is the field's value in JobConfig{}.
template <typename Sec, typename T>
Binding field(const char* section, const char* name, Sec JobConfig::*sec, T Sec::*member,
              std::string help, std::vector<std::string> choices = {}) {
  static const JobConfig defaults{};
  const T& def = defaults.*sec.*member;
  Binding b;
  if constexpr (std::is_same_v<T, bool>) {
    b.spec = KeySpec::boolean(section, name, def, std::move(help));
  } else if constexpr (std::is_integral_v<T>) {
    b.spec = KeySpec::integer(section, name, int64_t(def), std::move(help));
  } else if constexpr (std::is_floating_point_v<T>) {
    b.spec = KeySpec::real(section, name, double(def), std::move(help));
  } else {
    static_assert(std::is_same_v<T, std::string>);
    b.spec = choices.empty()
                 ? KeySpec::string(section, name, def, std::move(help))
                 : KeySpec::choice(section, name, std::move(choices), def, std::move(help));
  }
  std::string full = b.spec.full_name();
  b.load = [sec, member, full](JobConfig& c, const ConfigValue& v) {
    T& dst = c.*sec.*member;
    if constexpr (std::is_same_v<T, bool>) {
      dst = std::get<bool>(v);
    } else if constexpr (std::is_integral_v<T>) {
      int64_t i = std::get<int64_t>(v);
      if constexpr (sizeof(T) < sizeof(int64_t))
        if (i < int64_t(std::numeric_limits<T>::min()) ||
            i > int64_t(std::numeric_limits<T>::max()))
          MT_THROW(ConfigError, "{} must fit in a 32-bit integer, found {}", full, i);
      dst = T(i);
    } else if constexpr (std::is_floating_point_v<T>) {
      dst = std::get<double>(v);
    } else {
      dst = std::get<std::string>(v);
    }
  };
  b.store = [sec, member](const JobConfig& c) -> ConfigValue {
    const T& v = c.*sec.*member;
    if constexpr (std::is_same_v<T, bool>)
      return v;
    else if constexpr (std::is_integral_v<T>)
      return int64_t(v);
    else if constexpr (std::is_floating_point_v<T>)
      return double(v);
    else
      return v;
  };
  return b;
}

std::string check_selective_ac_option(const std::string& s) {
  bool positive_int = !s.empty() && s.size() < 10 &&
                      s.find_first_not_of("0123456789") == std::string::npos && std::stol(s) > 0;
  return s == "op" || positive_int ? ""
                                   : "\"op\" or a positive integer such as \"2\" (every 2nd layer)";
}

std::vector<Binding> make_bindings() {
  using J = JobConfig;
  std::vector<Binding> t;
  // [job]
  t.push_back(field("job", "dump_folder", &J::job, &JobSection::dump_folder,
                    "Folder to dump job outputs (run folders, traces, metrics)"));
  t.push_back(
      field("job", "description", &J::job, &JobSection::description, "Description of the job"));
  t.push_back(
      field("job", "device", &J::job, &JobSection::device,
            "Device to train on; auto = cuda when built with CUDA and a GPU is visible, else cpu",
            {"auto", "cpu", "cuda"}));
  t.push_back(field("job", "dump_graph", &J::job, &JobSection::dump_graph,
                    "Write rank 0's scheduled step and optimizer graphs (ops, shapes, streams, "
                    "collectives, memory offsets) to <dump_folder>/step_graph.txt at start-up"));
  // [model]
  t.push_back(field("model", "name", &J::model, &ModelSection::name, "Which model to train",
                    {"llama3", "deepseek_v3"}));
  t.push_back(field("model", "flavor", &J::model, &ModelSection::flavor,
                    "Which model config (size) to train"));
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
  t.push_back(field("model", "router_zero_init", &J::model, &ModelSection::router_zero_init,
                    "MoE models: all-zero initial router gate (every token ties and goes to the "
                    "lowest experts; for testing experts and ranks that receive nothing)"));
  // [optimizer]
  t.push_back(field("optimizer", "name", &J::optimizer, &OptimizerSection::name, "Optimizer to use",
                    {"AdamW"}));
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
  // [lr_scheduler]
  t.push_back(field("lr_scheduler", "warmup_steps", &J::lr_scheduler,
                    &LRSchedulerSection::warmup_steps, "Steps of linear lr warmup")
                  .at_least(0));
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
  t.push_back(field("lr_scheduler", "decay_type", &J::lr_scheduler, &LRSchedulerSection::decay_type,
                    "Learning rate decay shape", {"linear", "sqrt", "cosine"}));
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
  t.push_back(field("training", "steps", &J::training, &TrainingSection::steps,
                    "How many train steps to run")
                  .at_least(1));
  t.push_back(
      field("training", "seed", &J::training, &TrainingSection::seed,
            "Base RNG seed for weight init and data order (default 0; runs are always seeded)")
          .at_least(0));
  t.push_back(field("training", "deterministic", &J::training, &TrainingSection::deterministic,
                    "Use deterministic algorithms even where slower"));
  t.push_back(
      field("training", "dataset", &J::training, &TrainingSection::dataset,
            "Dataset: fortunes (fortune corpus), text (UTF-8 files), tokens (llm.c .bin files)",
            {"fortunes", "text", "tokens"}));
  t.push_back(field("training", "dataset_path", &J::training, &TrainingSection::dataset_path,
                    "Dataset file or folder; \"\" = the dataset's default location"));
  t.push_back(field(
      "training", "mixed_precision_param", &J::training, &TrainingSection::mixed_precision_param,
      "Dtype of parameters in forward/backward; auto = bfloat16 on cuda, float32 on cpu",
      {"auto", "bfloat16", "float32", "float64"}));
  t.push_back(field("training", "mixed_precision_reduce", &J::training,
                    &TrainingSection::mixed_precision_reduce, "Dtype of gradient reductions",
                    {"float32", "float64", "bfloat16"}));
  t.push_back(field("training", "master_dtype", &J::training, &TrainingSection::master_dtype,
                    "Dtype of master weights and optimizer state (float64 for exact parity tests)",
                    {"float32", "float64"}));
  // [metrics]
  t.push_back(field("metrics", "log_freq", &J::metrics, &MetricsSection::log_freq,
                    "How often to log metrics, in steps")
                  .at_least(1));
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
    static const JobConfig defaults{};
    Binding b;
    b.spec =
        KeySpec::choice("parallelism", "fsdp_reshard_after_forward", {"default", "always", "never"},
                        reshard_after_forward_name(defaults.parallelism.fsdp_reshard_after_forward),
                        "Re-gather parameters in backward instead of keeping them from forward")
            .booleans_map_to("always", "never");
    b.load = [](J& c, const ConfigValue& v) {
      const std::string& s = std::get<std::string>(v);
      c.parallelism.fsdp_reshard_after_forward = s == "always"  ? ReshardAfterForward::kAlways
                                                 : s == "never" ? ReshardAfterForward::kNever
                                                                : ReshardAfterForward::kDefault;
    };
    b.store = [](const J& c) -> ConfigValue {
      return std::string(reshard_after_forward_name(c.parallelism.fsdp_reshard_after_forward));
    };
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
  // [activation_checkpoint]
  t.push_back(field("activation_checkpoint", "mode", &J::activation_checkpoint,
                    &ActivationCheckpointSection::mode, "Activation checkpointing",
                    {"none", "full", "selective"}));
  {
    Binding b = field("activation_checkpoint", "selective_ac_option", &J::activation_checkpoint,
                      &ActivationCheckpointSection::selective_ac_option,
                      "Selective AC: \"op\" for per-op, or \"N\" to checkpoint every N-th layer");
    b.spec.accepts_integers().validated_by(check_selective_ac_option);
    t.push_back(std::move(b));
  }
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

void validate_job_config(const JobConfig& c) {
  const TrainingSection& t = c.training;
  if (t.global_batch_size != -1 && t.global_batch_size % t.local_batch_size != 0)
    MT_THROW(ConfigError,
             "[training] global_batch_size must be a multiple of [training] local_batch_size "
             "(times the data-parallel degree), found {} and {}",
             t.global_batch_size, t.local_batch_size);
  if (t.mixed_precision_param == "float64" && t.master_dtype != "float64")
    MT_THROW(ConfigError,
             "[training] mixed_precision_param float64 needs [training] master_dtype float64, "
             "found master_dtype {}",
             t.master_dtype);
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
