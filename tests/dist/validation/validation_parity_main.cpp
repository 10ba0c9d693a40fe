// Validation parity: the [validation] loss of an N-rank layout (given as --section.key
// overrides) against the 1-rank run of the same global batches. Rank 0 runs the reference on a
// communicator of its own; then every rank trains the layout, and after each step both run a
// validation pass (continuing through the held-out set). Every pass must agree within --tol, its
// main loss and each multi-token-prediction depth's.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/tiny_job.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validator.h"

using namespace meshtrain;

namespace {

struct Options {
  int steps = 3;
  double tol = 1e-5;
  std::vector<std::string> overrides;
};

// The tiny job (common/tiny_job.h) with seed 5, warmup 1 and a validation pass after every step.
JobConfig job(const Options& o, const std::vector<std::string>& extra) {
  const std::vector<std::string> validation = {"--validation.enable",
                                               "--validation.dataset",
                                               "text",
                                               "--validation.dataset_path",
                                               "/usr/share/games/fortunes/computers",
                                               "--validation.seq_len",
                                               "24",
                                               "--validation.steps",
                                               "2",
                                               "--validation.freq",
                                               "1"};
  return testing::tiny_job_config({.steps = o.steps,
                                   .seed = 5,
                                   .warmup_steps = 1,
                                   .dump_folder = "/tmp/meshtrain_validation_parity"},
                                  {validation, o.overrides, extra});
}

// Per pass: the main loss, then each multi-token-prediction depth's.
std::vector<std::vector<double>> run(Trainer& t, int steps) {
  std::vector<std::vector<double>> losses;
  for (int s = 0; s < steps; ++s) {
    StepRecord r = t.step();
    const ValidationMetrics v = t.validator()->run(r.step);
    losses.push_back({v.loss});
    losses.back().insert(losses.back().end(), v.mtp_losses.begin(), v.mtp_losses.end());
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tol")
      o.tol = std::stod(argv[++i]);
    else
      o.overrides.push_back(a);
  }
  Communicator& world = rt.world();
  const int rank = world.rank();
  int failures = 0;
  try {
    JobConfig par = job(o, {});
    Trainer dist(par, world, rt.launch());
    const int dp = dist.plan().group_size(MeshGroup::kDp);
    JobConfig ref_cfg = job(
        o, {"--parallelism.data_parallel_replicate_degree", "1",
            "--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree",
            "1", "--parallelism.expert_parallel_degree", "1",
            "--parallelism.expert_tensor_parallel_degree", "1", "--training.local_batch_size",
            std::to_string(par.training.local_batch_size * dp), "--validation.local_batch_size",
            std::to_string(par.validation.local_batch_size * dp)});
    std::unique_ptr<Communicator> self = world.split(rank, 0, "self");
    std::vector<std::vector<double>> ref;
    if (rank == 0) {
      Trainer t(ref_cfg, *self, rt.launch());
      ref = run(t, o.steps);
    }
    std::vector<std::vector<double>> got = run(dist, o.steps);
    if (rank == 0) {
      for (int s = 0; s < o.steps; ++s) {
        const std::vector<double>&g = got[size_t(s)], &w = ref[size_t(s)];
        if (g.size() != w.size() || int64_t(g.size()) != 1 + par.model.mtp_layers) ++failures;
        for (size_t k = 0; k < g.size() && k < w.size(); ++k) {
          const double r = std::abs(g[k] - w[k]) / std::abs(w[k]);
          std::printf("validation after step %d, %s: layout %.10f, 1 rank %.10f (rel %.2e)\n",
                      s + 1, k == 0 ? "loss" : fmt::format("mtp_loss_{}", k).c_str(), g[k], w[k],
                      r);
          if (!(r <= o.tol)) ++failures;
        }
      }
      // The passes read different held-out batches and the weights move: losses must differ.
      if (got.size() > 1 && got[0] == got[1]) ++failures;
      std::printf("%s\n", failures == 0 ? "VALIDATION PARITY OK" : "VALIDATION PARITY FAILED");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    abort_all(1);
  }
  return failures == 0 ? 0 : 1;
}
