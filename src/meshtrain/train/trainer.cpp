// Trainer: construction (the start-up sequence) and the step loop.
#include "meshtrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "meshtrain/comm/collective_watchdog.h"
#include "meshtrain/core/block_name.h"
#include "meshtrain/core/gpu_sharing.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/data/parallel_encode.h"
#include "meshtrain/moe/expert_exchange.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/tensorboard.h"
#include "meshtrain/train/torchtitan_assets.h"
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
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
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

  // Mesh: one communicator per named group, over the world communicator of this device's backend.
  ParallelDims dims = parallel_dims_of(cfg_, world_size_);
  mesh_ = std::make_unique<DeviceMesh>(world, dims);
  layout_ = std::make_unique<RankGroups>(mesh_->layout(), mesh_->rank());
  services_ = std::make_unique<Services>(*backend_, *mesh_);
  const int dp = mesh_->size(MeshGroup::kDp), dp_rank = mesh_->coord(MeshGroup::kDp);

  // Data. torchtitan's test assets fall back to meshtrain's own debug inputs (notes say so).
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

  // The step graph, its memory plan, and the executor.
  const bool data_sets_vocab = int64_t(loader_->max_token_id()) + 1 > tokenizer_->vocab_size();
  StepGraphOptions so{
      .tokenizer_vocab =
          std::max<int64_t>(tokenizer_->vocab_size(), int64_t(loader_->max_token_id()) + 1),
      .vocab_source = data_sets_vocab ? loader_->max_token_source() : tokenizer_->source(),
      .compute_dtype = compute_dtype_,
      .master_dtype = master_dtype_,
      .reduce_dtype = reduce_dtype_,
      .overwrite_grads = accum_steps_ == 1};
  std::unique_ptr<StepGraph> sg = build_step_graph(cfg_, layout_.get(), so);
  graph_ = std::move(sg->graph);
  model_ = std::move(sg->model);
  plan_ = std::move(sg->plan);
  tokens_ = sg->tokens;
  labels_ = sg->labels;
  token_count_ = sg->token_count;
  loss_ = sg->loss;
  loss_sum_ = sg->loss_sum;
  counts_ = count_model(*model_, *plan_, cfg_.training.seq_len);

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
  reshard_ = sg->reshard;
  checkpoint_ = sg->checkpoint;

  // The loss is normalised by the global number of target tokens of the step (packed windows:
  // every label counts), written once since it never changes.
  Tensor count_host = Tensor::from_vector(std::vector<int64_t>{tokens_per_step_}, Shape{1});
  backend_->copy(exec_->tensor(token_count_).raw(), count_host.raw(), 8, CopyKind::kHostToDevice,
                 backend_->stream(0));
  feeder_ =
      std::make_unique<InputFeeder>(*backend_, exec_->tensor(tokens_), exec_->tensor(labels_));

  const LoadBalanceOptions lb = load_balance_options(*plan_, *layout_);
  optimizer_ = std::make_unique<Optimizer>(*store_, adamw_params(cfg_, accum_steps_), *backend_,
                                           services_.get(), lb);
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

  dump_folder_ = cfg_.job.dump_folder;
  if (rank_ == 0) {
    std::filesystem::create_directories(dump_folder_);
    const ConfigValues effective = job_config_to_values(cfg_);
    std::ofstream(std::filesystem::path(dump_folder_) / "config.toml") << effective.to_toml();
    if (!cfg_.job.save_config_file.empty()) {
      const std::filesystem::path p =
          std::filesystem::path(dump_folder_) / cfg_.job.save_config_file;
      if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
      std::ofstream out(p);
      MT_CHECK_T(IoError, bool(out), "[job] save_config_file: cannot write '{}'", p.string());
      out << effective.to_json() << "\n";
    }
    if (cfg_.job.dump_graph)
      std::ofstream(std::filesystem::path(dump_folder_) / "step_graph.txt") << dump_step_graphs(
          graph_, exec_->plan(), accum_steps_, optimizer_->graph(), optimizer_->plan());
  }
  metrics_ = std::make_unique<MetricsLogger>(
      rank_ == 0 && cfg_.metrics.enable_jsonl
          ? (std::filesystem::path(dump_folder_) / "metrics.jsonl").string()
          : std::string());
  if (cfg_.metrics.enable_tensorboard && (rank_ == 0 || cfg_.metrics.save_for_all_ranks)) {
    // Each rank stamps its own folder with the local minute, as torchtitan does.
    const std::time_t t = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M", std::localtime(&t));
    metrics_->set_tensorboard(std::make_unique<TensorBoardWriter>(tensorboard_folder(
        dump_folder_, cfg_.metrics.save_tb_folder, stamp, rank_, cfg_.metrics.save_for_all_ranks)));
  }
  if (cfg_.profiling.enable_profiling)
    profiler_ = std::make_unique<Profiler>(*backend_, *exec_, int(accum_steps_), rank_);
  if (cfg_.validation.enable) {
    validator_ =
        std::make_unique<Validator>(cfg_, layout_.get(), so, *tokenizer_, *store_, *backend_,
                                    services_.get(), mesh_->comm(MeshGroup::kWorld), dp_rank, dp);
    for (const std::string& n : validator_->notes()) notes_.push_back(n);
  }
  if (cfg_.debug.dump_step > 0)
    debug_dump_ = std::make_unique<DebugDump>(dump_folder_, cfg_.debug.dump_step);
  sg.reset();
  log_startup();
  start_checkpointing(mesh_->dims());
}

void Trainer::start_checkpointing(const ParallelDims& dims) {
  CheckpointOptions o = cfg_.checkpoint;  // [checkpoint], its folder under [job] dump_folder
  o.folder = (std::filesystem::path(dump_folder_) / o.folder).string();
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
  step_ = resumed_.step;
  optimizer_offset_ = resumed_.optimizer_step - resumed_.step;
  lr_offset_ = resumed_.lr_step - resumed_.step;
}

void Trainer::wait_for_checkpoint() { checkpointer_->wait(); }

Trainer::~Trainer() = default;

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
  if (validator_) log_info("validation: {}", validator_->description());
  log_info("dump folder: {}", dump_folder_);
  if (const TensorBoardWriter* tb = metrics_->tensorboard())
    log_info("TensorBoard events: {}", tb->path());
  if (cfg_.job.dump_graph)
    log_info("step graph written to {}",
             (std::filesystem::path(dump_folder_) / "step_graph.txt").string());
}

double Trainer::read_step_loss() {
  Stream& s = backend_->stream(0);
  // The step's loss is summed over micro-batches on this rank; the global mean is the sum over
  // every rank, since each already divided by the global count: data-parallel ranks hold other
  // sequences, tensor-parallel ranks other token shards (sequence parallel).
  mesh_->comm(MeshGroup::kWorld).all_reduce(loss_sum_buffer_, ReduceOp::kSum, s);
  backend_->copy(host_scalar_.raw(), loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(),
                 CopyKind::kDeviceToHost, s);
  // Host sync, every step: the non-finite check ([training] skip_nonfinite_steps, the default
  // stop) must see the loss of the step it appears in, and the log line reuses it.
  s.synchronize();
  return host_scalar_.item_as_double(0);
}

void Trainer::run_micro_batches() {
  for (int64_t m = 0; m < accum_steps_; ++m) {
    feeder_->feed(*loader_);
    exec_->run();
  }
}

bool Trainer::padded_exchange_overflowed() {
  Stream& s = backend_->stream(0);
  mesh_->comm(MeshGroup::kWorld).all_reduce(ep_overflow_, ReduceOp::kSum, s);
  backend_->copy(host_overflow_.raw(), ep_overflow_.raw(), 4, CopyKind::kDeviceToHost, s);
  // Host sync, once per step and only with the padded exchange: every rank must know before the
  // optimizer whether some rank dropped rows, so that all redo the step or none does.
  s.synchronize();
  return host_overflow_.data<float>()[0] > 0;
}

void Trainer::replay_step_synced(const TokenLoader::State& data_at) {
  ++padded_replays_;
  if (rank_ == 0)  // every rank knows the same global count
    log_warn(
        "step {}: {} padded expert blocks or slots held more rows than planned ([parallelism] "
        "expert_capacity_factor {}); redoing the step with the synced exchange (steps redone so "
        "far: {} of {}){}",
        step_, int64_t(host_overflow_.data<float>()[0]), cfg_.parallelism.expert_capacity_factor,
        padded_replays_, step_,
        padded_replays_ == 1 ? "; a redone step costs a second pass: raise the factor above the "
                               "step lines' moe load max/mean, or use expert_exchange = \"synced\""
                             : "");
  // Host sync: the first pass's last gradient reductions may still run on the communication
  // streams, which the zeroing below on stream 0 is not ordered after (a replay is rare).
  backend_->synchronize();
  Stream& s = backend_->stream(0);
  // Everything the micro-batches accumulated goes back to zero: the loss, the gradients (when
  // several micro-batches add into them), the routed-token counters of the bias update. (The
  // counters' views and the warning above allocate on the host: only in a redone step.)
  backend_->fill_zero(loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(), s);
  if (accum_steps_ > 1)
    for (ParamGroup& g : store_->groups()) backend_->fill_zero(g.grad.raw(), g.grad.nbytes(), s);
  for (const LoadBalanceLayer& l : plan_->load_balance_layers()) {
    Tensor t = store_->master(l.tokens_per_expert);
    backend_->fill_zero(t.raw(), t.nbytes(), s);
  }
  loader_->restore(data_at);
  ops::set_ep_exchange_synced(graph_, true);
  run_micro_batches();
  ops::set_ep_exchange_synced(graph_, false);
}

HfRunContext Trainer::hf_context() {
  return HfRunContext{
      *model_, *plan_, *store_, *backend_, cfg_.training.seq_len, compute_dtype_, rank_, [this] {
        mesh_->comm(MeshGroup::kWorld).barrier();
      }};
}

StepRecord Trainer::step(bool /*read_back*/) {
  ++step_;
  fault_->begin_step(step_);
  const bool dump = debug_dump_ && debug_dump_->at(step_);
  if (dump) debug_dump_->weights(hf_context());
  Stream& s = backend_->stream(0);
  backend_->fill_zero(loss_sum_buffer_.raw(), loss_sum_buffer_.nbytes(), s);
  // Profiled steps only: the observer records events around every node of this step's runs.
  const bool profile = profiler_ && step_ % std::max<int64_t>(1, cfg_.profiling.profile_freq) == 0;
  if (profile) {
    profiler_->begin_step();
    exec_->set_observer(profiler_.get());
  }
  const RowCapacityStats rows_before = exec_->row_capacity_stats();
  TokenLoader::State data_at;
  if (ep_overflow_.defined()) {
    data_at = loader_->state();
    backend_->fill_zero(ep_overflow_.raw(), ep_overflow_.nbytes(), s);
  }
  run_micro_batches();
  const bool replay = ep_overflow_.defined() && padded_exchange_overflowed();
  if (replay) replay_step_synced(data_at);
  const RowCapacityStats rows_after = exec_->row_capacity_stats();
  if (profile) {
    exec_->set_observer(nullptr);
    profiler_->write_trace(
        (std::filesystem::path(dump_folder_) / cfg_.profiling.save_traces_folder).string(), step_);
  }
  StepRecord r;
  r.step = step_;
  r.padded_replayed = replay;
  r.expert_exchanges = rows_after.fits - rows_before.fits;
  r.expert_overflows = rows_after.overflows - rows_before.overflows;
  if (r.expert_overflows > 0)
    log_warn(
        "rank {} step {}: {} of {} expert exchanges received more rows than planned (most so far "
        "{:.2f}x the plan; [parallelism] expert_capacity_factor {}); handled dropless from a pool "
        "of {:.1f} MiB (grown {} times in all)",
        rank_, step_, r.expert_overflows, r.expert_exchanges, rows_after.max_fill,
        cfg_.parallelism.expert_capacity_factor, double(rows_after.pool_bytes) / (1 << 20),
        rows_after.grows);
  r.lr = schedule_->lr_at_step(step_ + lr_offset_);
  if (dump) debug_dump_->gradients(hf_context());
  fault_->before_optimizer(step_, *store_);
  optimizer_->step(step_ + optimizer_offset_, r.lr);
  // Every step: a NaN/Inf is caught on the step it appears (the AdamW kernels already skipped
  // the update on a non-finite norm). A skipped step does not advance the Adam step.
  r.loss = read_step_loss();
  r.grad_norm = optimizer_->last_grad_norm();
  r.skipped = fault_->after_optimizer(step_, r.loss, r.grad_norm, *checkpointer_);
  if (r.skipped) --optimizer_offset_;
  if (dump) {
    std::vector<std::pair<std::string, std::vector<double>>> loads;
    for (MoeLayerLoad& l : moe_load()) loads.emplace_back(l.layer, std::move(l.tokens));
    const int64_t rows = tokens_per_step_ / cfg_.training.seq_len;
    if (rank_ == 0)
      debug_dump_->summary({.step = step_,
                            .seq_len = cfg_.training.seq_len,
                            .rows_per_step = rows,
                            .window_begin = (step_ - 1) * rows,
                            .windows_per_epoch = loader_->windows_per_epoch(),
                            .dataset = cfg_.training.dataset,
                            .loss = r.loss,
                            .grad_norm = r.grad_norm,
                            .lr = r.lr},
                           loads);
  }
  checkpointer_->after_step(step_, step_ + optimizer_offset_, step_ + lr_offset_, r.lr);
  return r;
}

MoeLayerLoad summarize_moe_load(const std::string& layer, BlockIndex block,
                                std::vector<double> tokens) {
  MoeLayerLoad l;
  l.layer = layer;
  l.block = block;
  l.tokens = std::move(tokens);
  if (l.tokens.empty()) return l;
  l.min = *std::min_element(l.tokens.begin(), l.tokens.end());
  l.max = *std::max_element(l.tokens.begin(), l.tokens.end());
  for (double t : l.tokens) l.mean += t;
  l.mean /= double(l.tokens.size());
  l.imbalance = l.mean > 0 ? l.max / l.mean : 0.0;
  return l;
}

void add_moe_load_metrics(const std::vector<MoeLayerLoad>& loads, StepMetrics& m) {
  if (loads.empty()) return;
  double sum = 0;
  const MoeLayerLoad* worst = &loads[0];
  // Block 3 -> "layers.3": keys read moe.layers.3.load_max (a layer outside the blocks: its path).
  auto block = [](const MoeLayerLoad& l) {
    return l.block == kNoBlock ? l.layer : block_name(l.block);
  };
  for (const MoeLayerLoad& l : loads) {
    const std::string key = "moe." + block(l);
    m.extra[key + ".load_min"] = l.min;
    m.extra[key + ".load_max"] = l.max;
    m.extra[key + ".load_mean"] = l.mean;
    m.extra[key + ".imbalance"] = l.imbalance;
    sum += l.imbalance;
    if (l.imbalance > worst->imbalance) worst = &l;
  }
  const double avg = sum / double(loads.size());
  m.extra["moe.imbalance_avg"] = avg;
  m.extra["moe.imbalance_max"] = worst->imbalance;
  m.summary_suffix = fmt::format("moe load max/mean: avg {:.2f}, worst {:.2f} ({})", avg,
                                 worst->imbalance, block(*worst));
}

std::vector<MoeLayerLoad> Trainer::moe_load() {
  std::vector<MoeLayerLoad> out;
  const auto& layers = plan_->load_balance_layers();
  if (layers.empty()) return out;
  Stream& s = backend_->stream(0);
  size_t offset = 0;
  for (const LoadBalanceLayer& l : layers) {
    Tensor t = store_->master(l.last_load);
    backend_->copy(static_cast<char*>(host_load_.raw()) + offset, t.raw(), t.nbytes(),
                   CopyKind::kDeviceToHost, s);
    offset += t.nbytes();
  }
  // Host sync: the per-expert counts are read for the log line and metrics (logging steps).
  s.synchronize();
  int64_t at = 0;
  for (const LoadBalanceLayer& l : layers) {
    std::vector<double> tokens(static_cast<size_t>(l.num_experts));
    for (int64_t e = 0; e < l.num_experts; ++e)
      tokens[size_t(e)] = host_load_.item_as_double(at + e);
    at += l.num_experts;
    out.push_back(summarize_moe_load(l.layer, l.block, std::move(tokens)));
  }
  return out;
}

void Trainer::log_step(const StepRecord& r, double elapsed, int64_t steps_since) {
  StepMetrics m;
  m.step = r.step;
  m.loss = r.loss;
  m.grad_norm = r.grad_norm;
  m.lr = r.lr;
  m.step_time_s = elapsed / double(steps_since);
  const int non_dp = plan_->group_size(MeshGroup::kCp) * plan_->group_size(MeshGroup::kTp);
  double local_tokens =
      double(cfg_.training.local_batch_size * cfg_.training.seq_len * accum_steps_ * steps_since);
  m.tps = local_tokens / elapsed / double(non_dp);
  m.tflops = counts_.flops_per_token * m.tps / 1e12;
  const double peak = backend_->peak_flops(compute_dtype_);
  m.mfu = peak > 0 ? 100.0 * counts_.flops_per_token * m.tps / peak : -1.0;
  m.memory_gib = double(backend_->allocator().peak_bytes()) / double(1ull << 30);
  m.memory_pct = 100.0 * double(backend_->allocator().peak_bytes()) /
                 double(std::max<int64_t>(backend_->memory_capacity(), 1));
  add_moe_load_metrics(moe_load(), m);
  if (cfg_.training.skip_nonfinite_steps) {
    m.extra["skipped_steps"] = double(fault_->skipped_steps());
    m.summary_suffix += fmt::format("{}skipped steps: {}", m.summary_suffix.empty() ? "" : "  ",
                                    fault_->skipped_steps());
  }
  if (r.expert_exchanges > 0) m.extra["moe.capacity_overflows"] = double(r.expert_overflows);
  if (ep_overflow_.defined()) m.extra["moe.padded_replays"] = double(padded_replays_);
  metrics_->log(m);
}

std::vector<StepRecord> Trainer::train() {
  std::vector<StepRecord> logged;
  const int64_t log_freq = std::max<int64_t>(1, cfg_.metrics.log_freq);
  auto t_last = std::chrono::steady_clock::now();
  int64_t steps_since = 0;
  while (step_ < cfg_.training.steps) {
    bool log_now =
        (step_ + 1) % log_freq == 0 || step_ == resumed_.step || step_ + 1 == cfg_.training.steps;
    StepRecord r = step(log_now);
    ++steps_since;
    if (log_now) {
      log_step(r, seconds_since(t_last), steps_since);
      logged.push_back(r);
      t_last = std::chrono::steady_clock::now();
      steps_since = 0;
    }
    if (validator_ && validator_->due(r.step)) {
      // After the optimizer step (and its log line), as torchtitan does; its time is not the
      // training steps'.
      const auto t_val = std::chrono::steady_clock::now();
      metrics_->log_validation(validator_->run(r.step));
      t_last += std::chrono::steady_clock::now() - t_val;
    }
    if (fault_->stop_agreed()) {
      // Every rank stops after this same step: save it (unless it was just saved), then exit.
      interrupted_ = fault_->stop_signal();
      checkpointer_->save_now(step_, step_ + optimizer_offset_, step_ + lr_offset_, r.lr);
      break;
    }
  }
  backend_->synchronize();
  checkpointer_->wait();
  if (interrupted_ != 0) {
    const std::string saved = checkpointer_->latest_complete();
    log_info("training interrupted by {} after step {} of {}: {}; exiting with status {}",
             signal_name(interrupted_), step_, cfg_.training.steps,
             saved.empty() ? std::string("checkpointing is off, nothing saved")
                           : fmt::format("latest checkpoint {}", saved),
             kExitInterrupted);
    return logged;
  }
  log_info("training done: {} steps", step_);
  return logged;
}

}  // namespace meshtrain
