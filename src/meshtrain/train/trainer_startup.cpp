// Trainer's start-up: the named build steps the constructor runs in order (backend, mesh, data,
// step graph, executor, optimizer, run files, metrics, observers, validation), the start-up
// summary, and checkpointing (which may resume and so comes last).
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "meshtrain/core/gpu_sharing.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/data/parallel_encode.h"
#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/tensorboard.h"
#include "meshtrain/train/torchtitan_assets.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validator.h"

namespace meshtrain {

class Trainer::Services final : public ExecServices {
 public:
  Services(Backend& backend, DeviceMesh& mesh) : backend_(backend), mesh_(mesh) {}
  Communicator& comm(MeshGroup group) override { return mesh_.comm(group); }
  Backend& backend() override { return backend_; }

 private:
  Backend& backend_;
  DeviceMesh& mesh_;
};

DeviceType resolve_device(DeviceChoice device) {
  if (device == DeviceChoice::kAuto)
    return backend_available("cuda") ? DeviceType::kCUDA : DeviceType::kCPU;
  return device == DeviceChoice::kCuda ? DeviceType::kCUDA : DeviceType::kCPU;
}

const char* device_backend_name(DeviceType device) {
  return device == DeviceType::kCUDA ? "cuda" : "cpu";
}

DType resolve_compute_dtype(std::optional<DType> p, DeviceType device) {
  if (!p) return device == DeviceType::kCUDA ? DType::kBF16 : DType::kF32;
  const DType d = *p;
  MT_CHECK_T(ConfigError, !(device == DeviceType::kCPU && d == DType::kBF16),
             "[training] mixed_precision_param = \"bfloat16\" needs [job] device = \"cuda\": the "
             "cpu backend computes in float32 or float64");
  return d;
}

namespace {
std::string gib(int64_t b) { return fmt::format("{:.3f} GiB", double(b) / double(1ull << 30)); }

void check_supported(const JobConfig& cfg) {
  const auto& p = cfg.parallelism;
  MT_CHECK_T(ConfigError, p.context_parallel_degree == 1,
             "context parallel degree > 1 is not implemented yet (found cp={})",
             p.context_parallel_degree);
}
}  // namespace

namespace {
Communicator& world_of(const JobConfig& cfg, Runtime& runtime) {
  runtime.set_comm_timeouts({.init_seconds = double(cfg.comm.init_timeout_seconds),
                             .train_seconds = double(cfg.comm.train_timeout_seconds)});
  return runtime.world(resolve_device(cfg.job.device) == DeviceType::kCUDA ? "nccl" : "mpi");
}
}  // namespace

Trainer::Trainer(const JobConfig& cfg, Runtime& runtime)
    : Trainer(cfg, world_of(cfg, runtime), runtime.launch()) {}

Trainer::Trainer(const JobConfig& cfg, Communicator& world, const LaunchInfo& launch)
    : cfg_(cfg), launch_(launch), rank_(world.rank()), world_size_(world.size()) {
  check_supported(cfg_);
  open_backend(world);
  make_mesh(world);
  open_data();
  build_graph();
  bind_executor();
  make_optimizer();
  write_run_files();
  make_metrics();
  make_observers();
  make_validator();
  log_startup();
  start_checkpointing(mesh_->dims());
}

Trainer::~Trainer() = default;

void Trainer::open_backend(Communicator& world) {
  const DeviceType device = resolve_device(cfg_.job.device);
  compute_dtype_ = resolve_compute_dtype(cfg_.training.mixed_precision_param, device);
  master_dtype_ = cfg_.training.master_dtype;
  reduce_dtype_ = cfg_.training.mixed_precision_reduce;
  backend_ = create_backend(device_backend_name(device), launch_.local_rank);
  // --share-gpu only changes how NCCL ranks find each other; CPU ranks run over MPI, which
  // already runs any number of ranks on one host. Accepted (the same test command serves both
  // devices) and said once.
  if (share_gpu_requested() && device == DeviceType::kCPU)
    notes_.push_back(fmt::format(
        "--share-gpu ({}=1) has no effect with [job] device = \"cpu\": CPU ranks communicate "
        "over MPI, which runs any number of ranks on one host",
        kShareGpuVar));
  fault_ = std::make_unique<FaultGuard>(cfg_, *backend_, world);
}

// One communicator per named group, over the world communicator of this device's backend.
void Trainer::make_mesh(Communicator& world) {
  mesh_ = std::make_unique<DeviceMesh>(world, parallel_dims_of(cfg_, world_size_));
  layout_ = std::make_unique<RankGroups>(mesh_->layout(), mesh_->rank());
  services_ = std::make_unique<Services>(*backend_, *mesh_);
}

// torchtitan's test assets fall back to meshtrain's own debug inputs (notes say so).
void Trainer::open_data() {
  const int dp = mesh_->size(MeshGroup::kDp), dp_rank = mesh_->coord(MeshGroup::kDp);
  const TokenizerChoice tok = choose_tokenizer(cfg_.model.hf_assets_path);
  if (!tok.note.empty()) notes_.push_back(tok.note);
  tokenizer_ = open_tokenizer(tok);
  const DatasetChoice data =
      choose_dataset("training", cfg_.training.dataset, cfg_.training.dataset_path);
  if (!data.note.empty()) notes_.push_back(data.note);
  DataSource source = open_dataset(data, cfg_.training.dataset_text_field);
  accum_steps_ = gradient_accumulation_steps(cfg_.training, dp);
  loader_ = std::make_unique<TokenLoader>(
      source, *tokenizer_, cfg_.training.seq_len, cfg_.training.local_batch_size, dp_rank, dp,
      accum_steps_, uint64_t(cfg_.training.seed), encode_threads(0, launch_.local_world_size));
  tokens_per_step_ = cfg_.training.local_batch_size * cfg_.training.seq_len * dp * accum_steps_;
}

// The model's forward and backward as one graph, with its parallel plan and the passes applied.
void Trainer::build_graph() {
  const bool data_sets_vocab = int64_t(loader_->max_token_id()) + 1 > tokenizer_->vocab_size();
  step_options_ = StepGraphOptions{
      .tokenizer_vocab =
          std::max<int64_t>(tokenizer_->vocab_size(), int64_t(loader_->max_token_id()) + 1),
      .vocab_source = data_sets_vocab ? loader_->max_token_source() : tokenizer_->source(),
      .compute_dtype = compute_dtype_,
      .master_dtype = master_dtype_,
      .reduce_dtype = reduce_dtype_,
      .overwrite_grads = accum_steps_ == 1};
  std::unique_ptr<StepGraph> sg = build_step_graph(cfg_, layout_.get(), step_options_);
  graph_ = std::move(sg->graph);
  model_ = std::move(sg->model);
  plan_ = std::move(sg->plan);
  tokens_ = sg->tokens;
  labels_ = sg->labels;
  token_count_ = sg->token_count;
  loss_ = sg->loss;
  loss_sum_ = sg->loss_sum;
  reshard_ = sg->reshard;
  checkpoint_ = sg->checkpoint;
  mtp_token_count_ = sg->mtp_token_count;
  mtp_loss_weight_ = sg->mtp_loss_weight;
  fused_grad_matmuls_ = sg->fused_grad_matmuls;
  counts_ = count_model(*model_, *plan_, cfg_.training.seq_len);
}

// The memory plan, the executor, the parameters (initialised from the seed) and the step's
// fixed inputs.
void Trainer::bind_executor() {
  exec_ = std::make_unique<Executor>(graph_, plan_memory(graph_, backend_->device().type),
                                     *backend_, services_.get());
  store_ = std::make_unique<ParamStore>(*plan_, *backend_);
  store_->initialize(uint64_t(cfg_.training.seed));
  store_->bind(*exec_);
  const TensorMeta& lm = graph_.value(loss_sum_).meta;
  loss_sum_buffer_ = Tensor::empty(lm.shape, lm.dtype, backend_->allocator());
  exec_->bind(loss_sum_, loss_sum_buffer_);
  exec_->prepare();
  host_scalar_ = Tensor::empty(lm.shape, lm.dtype, backend_->host_staging_allocator());
  ep_overflow_ = ops::ep_overflow_counter(graph_);  // made by prepare() when the exchange is padded
  if (ep_overflow_.defined())
    host_overflow_ = Tensor::empty(Shape{1}, DType::kF32, backend_->host_staging_allocator());
  // The loss is normalised by the global number of target tokens of the step (packed windows:
  // every label counts), written once since it never changes.
  Tensor count_host = Tensor::from_vector(std::vector<int64_t>{tokens_per_step_}, Shape{1});
  backend_->copy(exec_->tensor(token_count_).raw(), count_host.raw(), 8, CopyKind::kHostToDevice,
                 backend_->stream(0));
  feeder_ =
      std::make_unique<InputFeeder>(*backend_, exec_->tensor(tokens_), exec_->tensor(labels_));
  mtp_ = std::make_unique<MtpInputs>(mtp_token_count_, mtp_loss_weight_, cfg_.model);
  mtp_->prepare(*exec_, tokens_per_step_, cfg_.training.seq_len);
}

// AdamW with the load-balance bias update, and the LR schedule.
void Trainer::make_optimizer() {
  const LoadBalanceOptions lb = load_balance_options(*plan_, *layout_);
  optimizer_ = std::make_unique<Optimizer>(*store_, adamw_params(cfg_, accum_steps_), *backend_,
                                           services_.get(), lb, cfg_.optimizer.overlap_next_step);
  if (optimizer_->overlaps())
    overlap_waits_ = exec_->wait_for_external_writes(optimizer_->writes());
  int64_t load_elems = 0;
  for (const LoadBalanceLayer& l : lb.layers) load_elems += l.num_experts;
  if (load_elems > 0)
    host_load_ = Tensor::empty(Shape{load_elems}, plan_->info(lb.layers[0].last_load).dtype,
                               backend_->host_staging_allocator());
  schedule_ = std::make_unique<LrSchedule>(LrScheduleConfig{
      .lr = cfg_.optimizer.lr,
      .warmup_steps = cfg_.lr_scheduler.warmup_steps,
      .decay_ratio = cfg_.lr_scheduler.decay_ratio.value_or(-1.0),
      .decay_type = cfg_.lr_scheduler.decay_type,
      .min_lr_factor = cfg_.lr_scheduler.min_lr_factor,
      .training_steps =
          cfg_.lr_scheduler.total_steps > 0 ? cfg_.lr_scheduler.total_steps : cfg_.training.steps});
}

// Rank 0: the effective config (TOML, and JSON when asked) and the step graph's dump.
void Trainer::write_run_files() const {
  if (rank_ != 0) return;
  std::filesystem::create_directories(dump_folder());
  const ConfigValues effective = job_config_to_values(cfg_);
  std::ofstream(std::filesystem::path(dump_folder()) / "config.toml") << effective.to_toml();
  if (!cfg_.job.save_config_file.empty()) {
    const std::filesystem::path p =
        std::filesystem::path(dump_folder()) / cfg_.job.save_config_file;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p);
    MT_CHECK_T(IoError, bool(out), "[job] save_config_file: cannot write '{}'", p.string());
    out << effective.to_json() << "\n";
  }
  if (cfg_.job.dump_graph)
    std::ofstream(std::filesystem::path(dump_folder()) / "step_graph.txt") << dump_step_graphs(
        graph_, exec_->plan(), accum_steps_, optimizer_->graph(), optimizer_->plan());
}

// metrics.jsonl (rank 0) and TensorBoard events.
void Trainer::make_metrics() {
  metrics_ = std::make_unique<MetricsLogger>(
      rank_ == 0 && cfg_.metrics.enable_jsonl
          ? (std::filesystem::path(dump_folder()) / "metrics.jsonl").string()
          : std::string());
  if (cfg_.metrics.enable_tensorboard && (rank_ == 0 || cfg_.metrics.save_for_all_ranks)) {
    // Each rank stamps its own folder with the local minute, as torchtitan does.
    const std::time_t t = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M", std::localtime(&t));
    metrics_->set_tensorboard(std::make_unique<TensorBoardWriter>(
        tensorboard_folder(dump_folder(), cfg_.metrics.save_tb_folder, stamp, rank_,
                           cfg_.metrics.save_for_all_ranks)));
  }
}

// [profiling] traces and the [debug] dump_step dump.
void Trainer::make_observers() {
  if (cfg_.profiling.enable_profiling)
    observers_.add(make_profiling_observer(
        std::make_unique<Profiler>(*backend_, *exec_, int(accum_steps_), rank_), *exec_,
        cfg_.profiling.profile_freq,
        (std::filesystem::path(dump_folder()) / cfg_.profiling.save_traces_folder).string()));
  if (cfg_.debug.dump_step > 0)
    observers_.add(make_debug_dump_observer(
        std::make_unique<DebugDump>(dump_folder(), cfg_.debug.dump_step),
        DebugDumpSources{.run = [this] { return hf_context(); },
                         .loads = [this] { return moe_load(); },
                         .fixed = {.seq_len = cfg_.training.seq_len,
                                   .rows_per_step = tokens_per_step_ / cfg_.training.seq_len,
                                   .windows_per_epoch = loader_->windows_per_epoch(),
                                   .dataset = cfg_.training.dataset},
                         .writes_summary = rank_ == 0}));
}

void Trainer::make_validator() {
  if (!cfg_.validation.enable) return;
  validator_ = std::make_unique<Validator>(
      cfg_, layout_.get(), step_options_, *tokenizer_, *store_, *backend_, services_.get(),
      mesh_->comm(MeshGroup::kWorld), mesh_->coord(MeshGroup::kDp), mesh_->size(MeshGroup::kDp));
  for (const std::string& n : validator_->notes()) notes_.push_back(n);
}

void Trainer::start_checkpointing(const ParallelDims& dims) {
  CheckpointOptions o = cfg_.checkpoint;  // [checkpoint], its folder under [job] dump_folder
  o.folder = (std::filesystem::path(dump_folder()) / o.folder).string();
  CheckpointRun run{.config_toml = job_config_to_values(cfg_).to_toml(),
                    .layout = MeshDegrees{dims.world, dims.dp_replicate, dims.dp_shard, dims.cp,
                                          dims.tp, dims.ep, dims.etp},
                    .seed = uint64_t(cfg_.training.seed),
                    .dataset = loader_->description(),
                    .training_steps = cfg_.training.steps,
                    .dp_rank = mesh_->coord(MeshGroup::kDp),
                    .dp_degree = mesh_->size(MeshGroup::kDp),
                    .accum_steps = accum_steps_,
                    .master_dtype = dtype_name(master_dtype_)};
  checkpointer_ =
      std::make_unique<CheckpointManager>(std::move(o), std::move(run), *model_, *plan_, *store_,
                                          *backend_, mesh_->comm(MeshGroup::kWorld), *loader_);
  resumed_ = checkpointer_->load_at_start();
  // A resume or an initial load wrote the masters: their compute copies follow before anything
  // reads them (Trainer::step checks again, for masters written later).
  store_->sync_compute_copies();
  step_ = resumed_.step;
  optimizer_offset_ = resumed_.optimizer_step - resumed_.step;
  lr_offset_ = resumed_.lr_step - resumed_.step;
}

void Trainer::log_startup() const {
  const MemoryPlan& mp = exec_->plan();
  log_info("meshtrain | device {} | world {} ({} launch)", backend_->description(), world_size_,
           launch_.launcher);
  if (share_gpu_requested() && backend_->device().is_cuda())
    log_info(
        "gpu sharing: the {} ranks of this node share GPU {} (rank {}'s; with several GPUs local "
        "rank r takes GPU r % GPUs) through {}=1: NCCL runs over sockets on lo, each rank its own "
        "NCCL_HOSTID; results are exact, communication speed is not representative",
        launch_.local_world_size, backend_->device().index, rank_, kShareGpuVar);
  for (const std::string& note : cfg_.notes) log_info("config: {}", note);
  for (const std::string& note : notes_) log_info("note: {}", note);
  if (cfg_.job.print_config) log_info("config:\n{}", job_config_to_values(cfg_).to_toml());
  log_info("{}", mesh_->describe());
  log_info("model: {}", model_->describe());
  log_info("parameters: {} total, {} active ({} without the input embedding); {:.3g} GFLOP/token",
           human_count(double(counts_.total_params)), human_count(counts_.active_params),
           human_count(counts_.active_non_embedding), counts_.flops_per_token / 1e9);
  log_info("dtypes: compute {}, master {}, reduce {}", dtype_name(compute_dtype_),
           dtype_name(master_dtype_), dtype_name(reduce_dtype_));
  log_info("tokenizer: {}", tokenizer_->name());
  log_info("data: {}", loader_->description());
  log_info("tokens per step: {} (local batch {} × seq {} × dp {} × accumulation {})",
           tokens_per_step_, cfg_.training.local_batch_size, cfg_.training.seq_len,
           mesh_->size(MeshGroup::kDp), accum_steps_);
  log_info("memory plan (per rank): {}; optimizer moments {}", mp.summary(),
           gib(2 * store_->trainable_numel() * int64_t(dtype_size(master_dtype_))));
  log_info(
      "step graph: {} nodes, {} values{}", exec_->plan().schedule.size(), graph_.num_values(),
      plan_->group_size(MeshGroup::kFsdp) > 1
          ? fmt::format(
                "; fsdp {} over {} ranks, reshard_after_forward {} ({} gathers redone in backward)",
                mesh_->dims().mode_name(), plan_->group_size(MeshGroup::kFsdp),
                reshard_after_forward_name(cfg_.parallelism.fsdp_reshard_after_forward),
                reshard_.gathers_recomputed)
          : std::string());
  if (fused_grad_matmuls_ > 0)
    log_info("weight gradients: {} GEMMs write the {} gradient buffers directly",
             fused_grad_matmuls_, dtype_name(master_dtype_));
  if (checkpoint_.regions > 0)
    log_info("activation checkpointing {}: {} nodes recomputed in backward over {} blocks",
             ac_mode_name(cfg_.activation_checkpoint.mode), checkpoint_.nodes_recomputed,
             checkpoint_.regions);
  log_info(
      "optimizer: AdamW lr {:g} betas ({:g}, {:g}) eps {:g} weight_decay {:g}, max_norm {:g}; "
      "warmup {} steps, {} decay to {:g}× over {} steps",
      cfg_.optimizer.lr, cfg_.optimizer.beta1, cfg_.optimizer.beta2, cfg_.optimizer.eps,
      cfg_.optimizer.weight_decay, cfg_.training.max_norm, cfg_.lr_scheduler.warmup_steps,
      lr_decay_name(cfg_.lr_scheduler.decay_type), cfg_.lr_scheduler.min_lr_factor,
      cfg_.training.steps);
  if (optimizer_->overlaps())
    log_info(
        "optimizer: overlaps the next step: {} AdamW slices on stream {}, the step graph "
        "waits for them at {} nodes",
        optimizer_->num_slices(), kOptimizerStream, overlap_waits_);
  if (validator_) log_info("validation: {}", validator_->description());
  log_info("dump folder: {}", dump_folder());
  if (const TensorBoardWriter* tb = metrics_->tensorboard())
    log_info("TensorBoard events: {}", tb->path());
  if (cfg_.job.dump_graph)
    log_info("step graph written to {}",
             (std::filesystem::path(dump_folder()) / "step_graph.txt").string());
}

}  // namespace meshtrain
