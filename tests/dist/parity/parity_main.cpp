// Parallel parity: an N-rank run (the parallel layout given as --section.key overrides) against
// the 1-rank run of the same global batch, same seed. Rank 0 runs the reference on a
// communicator of its own, then every rank runs the parallel job; per-step losses, gradient
// norms, each multi-token-prediction depth's loss and the final parameters (each rank's shard
// against the same slice of the reference, padding rows must stay zero) must agree within --tol
// (relative). --compare-reshard instead runs the layout with fsdp_reshard_after_forward never and
// always and requires equal losses;
// --compare-passes runs it with [compile] graph_passes none, transformer_block_bucketing and
// size_bucketing (a 1 MiB cap) and requires bitwise equal losses and gradient norms;
// --compare-copies runs it with [training] compute_weight_copies false (every micro-batch casts
// the masters) and true (the forward reads compute copies the optimizer writes) and requires the
// same, for a mixed-precision layout (float64 masters with float32 compute on the CPU, bf16 on
// CUDA); --compare-overlap runs it through Trainer::train() with [optimizer] overlap_next_step
// false and true and requires the same.
// On CUDA (--job.device cuda) the trainers run over the nccl world and the comparisons over MPI;
// --precisions float32,bfloat16 runs the check once per compute dtype (bf16: every step within
// --bf16-tol, the mean loss difference within --bf16-mean-tol, parameters within --bf16-tol), and
// each precision prints one `LAYOUT <name> <precision> PASS|FAIL ...` line with the worst figures.
// The routing counters (tokens per expert) are judged apart from the weights: in float32 the
// routing must be the reference's (share of tokens moved within --tol); in bfloat16 the share is
// reported, not judged: the gate logits carry 8 significant bits, so a token whose top-k scores
// tie within that rounding picks another expert under another reduction order, and what must
// track the reference is the training it drives (losses, norms, weights, expert bias).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/core/logging.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/trainer.h"
#include "parity_util.h"

using namespace meshtrain;

namespace {

struct Options {
  int steps = 20;
  double tol = 1e-5;
  // bf16 runs against the 1-rank bf16 run: the DeepSeek-V3 tracking bar of
  // tests/cuda/test_cuda_training.cpp (per step 1e-2, mean over the run 3e-3).
  double bf16_tol = 1e-2, bf16_mean_tol = 3e-3;
  bool compare_reshard = false;
  std::string name = "layout";
  std::vector<std::string> precisions;  // empty: the config's own mixed_precision_param
  bool expect_overflow = false;         // the layout's expert exchanges must exceed their plan
  bool compare_passes = false;
  bool compare_copies = false;
  bool compare_overlap = false;
  // "none", "some" or "all": how many steps the padded expert exchange must redo synced; "any":
  // reported only (empty: neither).
  std::string expect_replays;
  std::vector<std::string> overrides;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps")
      o.steps = std::stoi(argv[++i]);
    else if (a == "--tol")
      o.tol = std::stod(argv[++i]);
    else if (a == "--bf16-tol")
      o.bf16_tol = std::stod(argv[++i]);
    else if (a == "--bf16-mean-tol")
      o.bf16_mean_tol = std::stod(argv[++i]);
    else if (a == "--name")
      o.name = argv[++i];
    else if (a == "--precisions")
      o.precisions = split_commas(argv[++i]);
    else if (a == "--compare-reshard")
      o.compare_reshard = true;
    else if (a == "--expect-overflow")
      o.expect_overflow = true;
    else if (a == "--compare-passes")
      o.compare_passes = true;
    else if (a == "--compare-copies")
      o.compare_copies = true;
    else if (a == "--compare-overlap")
      o.compare_overlap = true;
    else if (a == "--expect-replays")
      o.expect_replays = argv[++i];
    else
      o.overrides.push_back(a);
  }
  return o;
}

JobConfig job(const Options& o, const std::vector<std::string>& extra) {
  return testing::harness_job(o.steps, {o.overrides, extra});
}

using testing::rel;
using testing::RunResult;
RunResult run(Trainer& t, int steps) { return testing::run_steps(t, steps); }

double all_reduce_host(Communicator& comm, Backend& host, double x, ReduceOp op) {
  Tensor t = Tensor::from_vector(std::vector<double>{x}, Shape{1});
  comm.all_reduce(t, op, host.stream(0));
  return t.data<double>()[0];
}

// The worst figures of one layout against its 1-rank run; every rank holds the global ones.
struct Figures {
  double loss = 0, grad_norm = 0, mean_loss = 0, param = 0, routing = 0;
  int failures = 0;
};

// One parallel run (trainers over `world`) against the 1-rank run of the same global batch on
// rank 0; `host_comm` (MPI) carries the comparisons, whose tensors live on the host.
// `routing_tol` judges the share of routed tokens that moved (infinite: reported only).
Figures check_layout(const Options& o, const std::vector<std::string>& extra, double tol,
                     double mean_tol, double routing_tol, const LaunchInfo& launch,
                     Communicator& world, Communicator& host_comm, Backend& host) {
  const int rank = world.rank();
  Figures f;
  JobConfig par = job(o, extra);
  Trainer dist(par, world, launch);
  const int dp = dist.plan().group_size(MeshGroup::kDp);
  const int64_t accum =
      dist.tokens_per_step() / (par.training.local_batch_size * par.training.seq_len * dp);
  // The reference: one rank, local batch × dp rows, the same number of micro-batches.
  std::vector<std::string> one = extra;
  for (const char* kv :
       {"--parallelism.data_parallel_replicate_degree", "1",
        "--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree",
        "1", "--parallelism.expert_parallel_degree", "1",
        "--parallelism.expert_tensor_parallel_degree", "1"})
    one.push_back(kv);
  for (const std::string& kv : {std::string("--training.local_batch_size"),
                                std::to_string(par.training.local_batch_size * dp),
                                std::string("--training.global_batch_size"),
                                std::to_string(par.training.local_batch_size * dp * accum)})
    one.push_back(kv);
  JobConfig ref_cfg = job(o, one);
  std::unique_ptr<Communicator> self = world.split(rank, 0, "self");
  RunResult ref;
  std::unique_ptr<Trainer> ref_trainer;
  if (rank == 0) {
    ref_trainer = std::make_unique<Trainer>(ref_cfg, *self, launch);
    ref = run(*ref_trainer, o.steps);
  }
  // The other ranks wait here, on the host, while rank 0 runs the reference: inside the parallel
  // run's first collective they would spin NCCL kernels on a GPU rank 0 may be sharing.
  host_comm.barrier();
  RunResult got = run(dist, o.steps);
  if (rank == 0) {
    double sum_loss = 0;
    for (int s = 0; s < o.steps; ++s) {
      double dl = rel(got.loss[size_t(s)], ref.loss[size_t(s)]);
      double dn = rel(got.grad_norm[size_t(s)], ref.grad_norm[size_t(s)]);
      f.loss = std::max(f.loss, dl);
      f.grad_norm = std::max(f.grad_norm, dn);
      sum_loss += dl;
      std::printf(
          "step %2d  loss %.10f (ref %.10f, rel %.2e)  grad_norm %.8f (ref %.8f, rel %.2e)\n",
          s + 1, got.loss[size_t(s)], ref.loss[size_t(s)], dl, got.grad_norm[size_t(s)],
          ref.grad_norm[size_t(s)], dn);
      if (!(dl <= tol) || !(dn <= tol)) ++f.failures;
      // Multi-token prediction: every depth's loss tracks the reference's too.
      const std::vector<double>& gm = got.mtp_loss[size_t(s)];
      const std::vector<double>& rm = ref.mtp_loss[size_t(s)];
      if (gm.size() != rm.size() || int64_t(gm.size()) != par.model.mtp_layers) {
        ++f.failures;
        std::printf("step %2d: %zu MTP losses (reference %zu), expected %lld\n", s + 1, gm.size(),
                    rm.size(), (long long)par.model.mtp_layers);
        continue;
      }
      for (size_t k = 0; k < gm.size(); ++k) {
        const double dm = rel(gm[k], rm[k]);
        f.loss = std::max(f.loss, dm);
        std::printf("         mtp_loss_%zu %.10f (ref %.10f, rel %.2e)\n", k + 1, gm[k], rm[k], dm);
        if (!(dm <= tol)) ++f.failures;
      }
    }
    f.mean_loss = sum_loss / std::max(1, o.steps);
    if (!(f.mean_loss <= mean_tol)) ++f.failures;
    std::printf(
        "max relative difference: loss %.3e, grad_norm %.3e (tolerance %.1e); mean loss %.3e "
        "(tolerance %.1e)\n",
        f.loss, f.grad_norm, tol, f.mean_loss, mean_tol);
  }
  // Expert exchanges beyond the planned capacity, over all ranks (handled dropless).
  Tensor ov = Tensor::from_vector(std::vector<int64_t>{got.expert_exchanges, got.expert_overflows},
                                  Shape{2});
  host_comm.all_reduce(ov, ReduceOp::kSum, host.stream(0));
  const int64_t exchanges = ov.data<int64_t>()[0], overflows = ov.data<int64_t>()[1];
  if (rank == 0)
    std::printf("expert exchanges over the planned capacity: %lld of %lld (all ranks)\n",
                (long long)overflows, (long long)exchanges);
  if (o.expect_overflow && overflows == 0) {
    ++f.failures;
    if (rank == 0) std::printf("expected exchanges over the planned capacity, found none\n");
  }
  // The padded exchange: steps redone synced (every rank redoes the same steps).
  if (!o.expect_replays.empty()) {
    const int64_t n = got.padded_replays;
    if (rank == 0)
      std::printf("padded expert exchange: %lld of %d steps redone synced (expected %s)\n",
                  (long long)n, o.steps, o.expect_replays.c_str());
    const bool ok = o.expect_replays == "none"   ? n == 0
                    : o.expect_replays == "all"  ? n == o.steps
                    : o.expect_replays == "some" ? n > 0 && n < o.steps
                                                 : o.expect_replays == "any";
    if (!ok) ++f.failures;
  }
  // Final parameters: rank 0 broadcasts each reference tensor; every rank checks its shard.
  const testing::ParamDiff pd = testing::compare_params(dist, ref_trainer.get(), host_comm, host);
  if (!(pd.worst <= tol)) {
    ++f.failures;
    std::printf("rank %d: parameter %s differs by %.3e (tolerance %.1e)\n", rank, pd.where.c_str(),
                pd.worst, tol);
  }
  if (!(pd.routing <= routing_tol)) {
    ++f.failures;
    std::printf(
        "rank %d: routing counter %s: %.3e of the layer's routed tokens moved (tolerance "
        "%.1e)\n",
        rank, pd.routing_where.c_str(), pd.routing, routing_tol);
  }
  f.param = all_reduce_host(host_comm, host, pd.worst, ReduceOp::kMax);
  f.routing = all_reduce_host(host_comm, host, pd.routing, ReduceOp::kMax);
  f.failures = int(all_reduce_host(host_comm, host, f.failures, ReduceOp::kSum));
  if (rank == 0)
    std::printf(
        "final parameters: max relative difference %.3e over all ranks; routing counters: "
        "at most %.3e of a layer's routed tokens moved%s\n",
        f.param, f.routing, std::isinf(routing_tol) ? " (reported, not judged)" : "");
  return f;
}

// Runs `a` and `b` on all ranks (step by step, or through train() when `train_loop`: the configs
// then log every step); returns the steps whose loss or gradient norm differ in any bit.
int compare_bitwise(const Options& o, Communicator& world, const LaunchInfo& launch,
                    const JobConfig& a_cfg, const JobConfig& b_cfg, const char* a_name,
                    const char* b_name, bool train_loop = false) {
  RunResult a, b;
  {
    Trainer t(a_cfg, world, launch);
    a = train_loop ? testing::run_train(t) : run(t, o.steps);
  }
  {
    Trainer t(b_cfg, world, launch);
    b = train_loop ? testing::run_train(t) : run(t, o.steps);
  }
  if (a.loss.size() != size_t(o.steps) || b.loss.size() != size_t(o.steps)) {
    if (world.rank() == 0)
      std::printf("%s: %zu steps, %s: %zu steps, expected %d\n", a_name, a.loss.size(), b_name,
                  b.loss.size(), o.steps);
    return 1;
  }
  int failures = 0;
  const bool root = world.rank() == 0;
  for (int s = 0; s < o.steps; ++s)
    if (a.loss[size_t(s)] != b.loss[size_t(s)] ||
        a.grad_norm[size_t(s)] != b.grad_norm[size_t(s)] ||
        a.mtp_loss[size_t(s)] != b.mtp_loss[size_t(s)]) {
      ++failures;
      if (root)
        std::printf("step %d: %s loss %.17g norm %.17g, %s loss %.17g norm %.17g\n", s + 1, a_name,
                    a.loss[size_t(s)], a.grad_norm[size_t(s)], b_name, b.loss[size_t(s)],
                    b.grad_norm[size_t(s)]);
    }
  if (root)
    std::printf("%s vs %s: %d mismatching steps of %d (bitwise)\n", a_name, b_name, failures,
                o.steps);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  Options o = parse(argc, argv);
  Communicator& host_comm = rt.world();                      // MPI: host tensors
  std::unique_ptr<Backend> host = create_backend("cpu", 0);  // stream for host-side collectives
  const int rank = host_comm.rank();
  int failures = 0;
  try {
    JobConfig probe = job(o, {});
    const bool cuda = resolve_device(probe.job.device) == DeviceType::kCUDA;
    rt.set_comm_timeouts({.init_seconds = double(probe.comm.init_timeout_seconds),
                          .train_seconds = double(probe.comm.train_timeout_seconds)});
    Communicator& world = cuda ? rt.world("nccl") : host_comm;  // what the trainers run over
    if (o.compare_reshard) {
      failures += compare_bitwise(o, world, rt.launch(),
                                  job(o, {"--parallelism.fsdp_reshard_after_forward", "never"}),
                                  job(o, {"--parallelism.fsdp_reshard_after_forward", "always"}),
                                  "reshard never", "reshard always");
    } else if (o.compare_passes) {
      const JobConfig none = job(o, {"--compile.graph_passes", "none"});
      failures += compare_bitwise(o, world, rt.launch(), none,
                                  job(o, {"--compile.graph_passes", "transformer_block_bucketing"}),
                                  "unbucketed", "transformer_block_bucketing");
      failures += compare_bitwise(
          o, world, rt.launch(), none,
          job(o, {"--compile.graph_passes", "size_bucketing", "--compile.bucket_cap_mb", "1"}),
          "unbucketed", "size_bucketing");
    } else if (o.compare_overlap) {
      const std::vector<std::string> logged = {"--metrics.log_freq", "1"};
      std::vector<std::string> overlapped = logged;
      overlapped.insert(overlapped.end(), {"--optimizer.overlap_next_step", "true"});
      failures += compare_bitwise(o, world, rt.launch(), job(o, logged), job(o, overlapped),
                                  "update in line", "update overlapped", true);
    } else if (o.compare_copies) {
      failures += compare_bitwise(
          o, world, rt.launch(), job(o, {"--training.compute_weight_copies", "false"}),
          job(o, {"--training.compute_weight_copies", "true"}), "cast path", "compute copies");
    } else {
      std::vector<std::string> precisions = o.precisions;
      if (precisions.empty()) precisions.push_back("");  // the config's own dtype
      for (const std::string& p : precisions) {
        const bool bf16 = p == "bfloat16" || p == "bf16";
        const double tol = bf16 ? o.bf16_tol : o.tol;
        const double mean_tol = bf16 ? o.bf16_mean_tol : o.tol;
        const double routing_tol = bf16 ? INFINITY : o.tol;
        std::vector<std::string> extra;
        if (!p.empty()) extra = {"--training.mixed_precision_param", p};
        if (rank == 0 && !p.empty()) std::printf("== %s, %s ==\n", o.name.c_str(), p.c_str());
        const Figures f = check_layout(o, extra, tol, mean_tol, routing_tol, rt.launch(), world,
                                       host_comm, *host);
        failures += f.failures;
        if (rank == 0) {
          std::printf(
              "LAYOUT %s %s %s ranks %d steps %d loss %.3e grad_norm %.3e mean_loss %.3e param "
              "%.3e tol %.1e routing %.3e\n",
              o.name.c_str(), p.empty() ? "default" : p.c_str(), f.failures == 0 ? "PASS" : "FAIL",
              host_comm.size(), o.steps, f.loss, f.grad_norm, f.mean_loss, f.param, tol, f.routing);
          std::fflush(stdout);
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    abort_all(2);
  }
  // Layout failures are already global; reshard mismatches are counted on every rank alike.
  if (rank == 0) std::printf("%s\n", failures == 0 ? "PARITY OK" : "PARITY FAILED");
  return failures == 0 ? 0 : 1;
}
