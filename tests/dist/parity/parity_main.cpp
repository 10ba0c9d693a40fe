// Parallel parity: an N-rank run (the parallel layout given as --section.key overrides) against
// the 1-rank run of the same global batch, same seed. Rank 0 runs the reference on a
// communicator of its own, then every rank runs the parallel job; per-step losses, gradient
// norms and the final parameters (each rank's shard against the same slice of the reference,
// padding rows must stay zero) must agree within --tol (relative). --compare-reshard instead
// runs the layout with fsdp_reshard_after_forward never and always and requires equal losses.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/comm/bootstrap.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/train/trainer.h"

using namespace meshtrain;

namespace {

struct Options {
  int steps = 20;
  double tol = 1e-5;
  bool compare_reshard = false;
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
    else
      o.overrides.push_back(a);
  }
  return o;
}

JobConfig job(const Options& o, const std::vector<std::string>& extra) {
  std::vector<std::string> all = {"--job.device",
                                  "cpu",
                                  "--model.flavor",
                                  "tiny",
                                  "--training.seq_len",
                                  "32",
                                  "--training.steps",
                                  std::to_string(o.steps),
                                  "--training.seed",
                                  "3",
                                  "--optimizer.lr",
                                  "3e-3",
                                  "--lr_scheduler.warmup_steps",
                                  "3",
                                  "--metrics.enable_jsonl",
                                  "false",
                                  "--job.dump_folder",
                                  "/tmp/meshtrain_parity"};
  all.insert(all.end(), o.overrides.begin(), o.overrides.end());
  all.insert(all.end(), extra.begin(), extra.end());
  return parse_job_config("", all);
}

struct RunResult {
  std::vector<double> loss, grad_norm;
};

RunResult run(Trainer& t, int steps) {
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    StepRecord rec = t.step(true);
    r.loss.push_back(rec.loss);
    r.grad_norm.push_back(rec.grad_norm);
  }
  return r;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

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
      JobConfig never = job(o, {"--parallelism.fsdp_reshard_after_forward", "never"});
      JobConfig always = job(o, {"--parallelism.fsdp_reshard_after_forward", "always"});
      RunResult a, b;
      {
        Trainer t(never, world, rt.launch());
        a = run(t, o.steps);
      }
      {
        Trainer t(always, world, rt.launch());
        b = run(t, o.steps);
      }
      for (int s = 0; s < o.steps; ++s)
        if (a.loss[size_t(s)] != b.loss[size_t(s)] ||
            a.grad_norm[size_t(s)] != b.grad_norm[size_t(s)]) {
          ++failures;
          if (rank == 0)
            std::printf("step %d: never loss %.17g norm %.17g, always loss %.17g norm %.17g\n",
                        s + 1, a.loss[size_t(s)], a.grad_norm[size_t(s)], b.loss[size_t(s)],
                        b.grad_norm[size_t(s)]);
        }
      if (rank == 0)
        std::printf("reshard never vs always: %d mismatching steps of %d\n", failures, o.steps);
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
      double worst_param = 0;
      std::string worst_name;
      for (const ParamInfo& p : dist.plan().params()) {
        Tensor full = Tensor::empty(p.global_shape, p.dtype);
        if (rank == 0) full.copy_from_host(ref_trainer->params().master_to_host(p.name));
        world.broadcast(full, 0, host->stream(0));
        Tensor mine = dist.params().master_to_host(p.name);
        // Walk the local block; each element maps to global index piece.begin + local index.
        const Shape& ls = p.local_shape;
        const int rk = ls.rank();
        std::vector<int64_t> idx(size_t(rk), 0);
        for (int64_t i = 0; i < mine.numel(); ++i) {
          std::vector<int64_t> gidx(static_cast<size_t>(rk));
          int64_t flat = 0;
          for (int d = 0; d < rk; ++d) {
            gidx[size_t(d)] = p.piece.at(d) + idx[size_t(d)];
            flat = flat * p.global_shape[d] + gidx[size_t(d)];
          }
          const bool pad = p.piece.is_padding(gidx, p.global_shape);
          double x = mine.item_as_double(i);
          double want = pad ? 0.0 : full.item_as_double(flat);
          double diff = pad ? (x == 0.0 ? 0.0 : 1.0) : std::abs(x - want) / (1.0 + std::abs(want));
          if (diff > worst_param) {
            worst_param = diff;
            worst_name = fmt::format("{}[flat {}]", p.name, pad ? -1 : flat);
          }
          for (int d = rk - 1; d >= 0; --d) {
            if (++idx[size_t(d)] < ls[d]) break;
            idx[size_t(d)] = 0;
          }
        }
      }
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
