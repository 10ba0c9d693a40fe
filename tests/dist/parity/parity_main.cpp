// Parallel parity: an N-rank run (the parallel layout given as --section.key overrides) against
// the 1-rank run of the same global batch, same seed. Rank 0 runs the reference on a
// communicator of its own, then every rank runs the parallel job; per-step losses, gradient
// norms and the final parameters (each rank's shard against the same slice of the reference,
// padding rows must stay zero) must agree within --tol (relative). --compare-reshard instead
// runs the layout with fsdp_reshard_after_forward never and always and requires equal losses;
// --compare-passes runs it with [compile] graph_passes none, transformer_block_bucketing and
// size_bucketing (a 1 MiB cap) and requires bitwise equal losses and gradient norms.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/comm/bootstrap.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/train/trainer.h"
#include "parity_util.h"

using namespace meshtrain;

namespace {

struct Options {
  int steps = 20;
  double tol = 1e-5;
  bool compare_reshard = false;
  bool compare_passes = false;
  std::vector<std::string> overrides;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps")
      o.steps = std::stoi(argv[++i]);
    else if (a == "--tol")
      o.tol = std::stod(argv[++i]);
    else if (a == "--compare-reshard")
      o.compare_reshard = true;
    else if (a == "--compare-passes")
      o.compare_passes = true;
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

// Runs `a` and `b` on all ranks; returns the steps whose loss or gradient norm differ in any bit.
int compare_bitwise(const Options& o, Runtime& rt, const JobConfig& a_cfg, const JobConfig& b_cfg,
                    const char* a_name, const char* b_name) {
  RunResult a, b;
  {
    Trainer t(a_cfg, rt.world(), rt.launch());
    a = run(t, o.steps);
  }
  {
    Trainer t(b_cfg, rt.world(), rt.launch());
    b = run(t, o.steps);
  }
  int failures = 0;
  const bool root = rt.world().rank() == 0;
  for (int s = 0; s < o.steps; ++s)
    if (a.loss[size_t(s)] != b.loss[size_t(s)] ||
        a.grad_norm[size_t(s)] != b.grad_norm[size_t(s)]) {
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
  Communicator& world = rt.world();
  std::unique_ptr<Backend> host = create_backend("cpu", 0);  // stream for host-side collectives
  const int rank = world.rank();
  int failures = 0;
  try {
    JobConfig par = job(o, {});
    if (o.compare_reshard) {
      failures +=
          compare_bitwise(o, rt, job(o, {"--parallelism.fsdp_reshard_after_forward", "never"}),
                          job(o, {"--parallelism.fsdp_reshard_after_forward", "always"}),
                          "reshard never", "reshard always");
    } else if (o.compare_passes) {
      const JobConfig none = job(o, {"--compile.graph_passes", "none"});
      failures += compare_bitwise(o, rt, none,
                                  job(o, {"--compile.graph_passes", "transformer_block_bucketing"}),
                                  "unbucketed", "transformer_block_bucketing");
      failures += compare_bitwise(
          o, rt, none,
          job(o, {"--compile.graph_passes", "size_bucketing", "--compile.bucket_cap_mb", "1"}),
          "unbucketed", "size_bucketing");
    } else {
      Trainer dist(par, world, rt.launch());
      const int dp = dist.plan().group_size(MeshGroup::kDp);
      const int64_t accum =
          dist.tokens_per_step() / (par.training.local_batch_size * par.training.seq_len * dp);
      // The reference: one rank, local batch × dp rows, the same number of micro-batches.
      std::vector<std::string> one = {"--parallelism.data_parallel_replicate_degree",
                                      "1",
                                      "--parallelism.data_parallel_shard_degree",
                                      "1",
                                      "--parallelism.tensor_parallel_degree",
                                      "1",
                                      "--parallelism.expert_parallel_degree",
                                      "1",
                                      "--parallelism.expert_tensor_parallel_degree",
                                      "1",
                                      "--training.local_batch_size",
                                      std::to_string(par.training.local_batch_size * dp),
                                      "--training.global_batch_size",
                                      std::to_string(par.training.local_batch_size * dp * accum)};
      JobConfig ref_cfg = job(o, one);
      std::unique_ptr<Communicator> self = world.split(rank, 0, "self");
      RunResult ref;
      std::unique_ptr<Trainer> ref_trainer;
      if (rank == 0) {
        ref_trainer = std::make_unique<Trainer>(ref_cfg, *self, rt.launch());
        ref = run(*ref_trainer, o.steps);
      }
      RunResult got = run(dist, o.steps);
      if (rank == 0) {
        double worst_loss = 0, worst_norm = 0;
        for (int s = 0; s < o.steps; ++s) {
          double dl = rel(got.loss[size_t(s)], ref.loss[size_t(s)]);
          double dn = rel(got.grad_norm[size_t(s)], ref.grad_norm[size_t(s)]);
          worst_loss = std::max(worst_loss, dl);
          worst_norm = std::max(worst_norm, dn);
          std::printf(
              "step %2d  loss %.10f (ref %.10f, rel %.2e)  grad_norm %.8f (ref %.8f, rel %.2e)\n",
              s + 1, got.loss[size_t(s)], ref.loss[size_t(s)], dl, got.grad_norm[size_t(s)],
              ref.grad_norm[size_t(s)], dn);
          if (!(dl <= o.tol) || !(dn <= o.tol)) ++failures;
        }
        std::printf("max relative difference: loss %.3e, grad_norm %.3e (tolerance %.1e)\n",
                    worst_loss, worst_norm, o.tol);
      }
      // Final parameters: rank 0 broadcasts each reference tensor; every rank checks its shard.
      const testing::ParamDiff pd = testing::compare_params(dist, ref_trainer.get(), world, *host);
      const double worst_param = pd.worst;
      const std::string& worst_name = pd.where;
      if (!(worst_param <= o.tol)) {
        ++failures;
        std::printf("rank %d: parameter %s differs by %.3e (tolerance %.1e)\n", rank,
                    worst_name.c_str(), worst_param, o.tol);
      } else if (rank == 0) {
        std::printf("final parameters: max relative difference %.3e on rank 0\n", worst_param);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    abort_all(2);
  }
  Tensor f = Tensor::from_vector(std::vector<int32_t>{failures}, Shape{1});
  world.all_reduce(f, ReduceOp::kSum, host->stream(0));
  int total = f.data<int32_t>()[0];
  if (rank == 0) std::printf("%s\n", total == 0 ? "PARITY OK" : "PARITY FAILED");
  return total == 0 ? 0 : 1;
}
