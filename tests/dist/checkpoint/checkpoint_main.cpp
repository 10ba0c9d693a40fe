// Checkpoint acceptance under real ranks.
//   --same: on one layout, a 20-step run beside a run stopped after its save at step 10 and resumed
//     by a fresh trainer from the folder (no flags): losses, gradient norms and final parameters
//     must be bitwise equal.
//   --reshard: a run on the --save layout saves at step 10; a run on the --load layout resumes
//     from it (initial_load_path); both must track the 1-rank run of the same global batch
//     within --tol (losses, norms, final parameters), as the parity tests do.
// Arguments: [--name N] [--same|--reshard] [--async] [--tol T] [common overrides]
//            --save NP [overrides] [--load NP [overrides]]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../parity/parity_util.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/train/trainer.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string name = "ckpt";
  bool same = false, async = false;
  double tol = 1e-5;
  int save_np = 1, load_np = 1;
  std::vector<std::string> common, save, load;
};

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string>* into = &o.common;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--name")
      o.name = argv[++i];
    else if (a == "--same")
      o.same = true;
    else if (a == "--reshard")
      o.same = false;
    else if (a == "--async")
      o.async = true;
    else if (a == "--tol")
      o.tol = std::stod(argv[++i]);
    else if (a == "--save")
      o.save_np = std::stoi(argv[++i]), into = &o.save;
    else if (a == "--load")
      o.load_np = std::stoi(argv[++i]), into = &o.load;
    else
      into->push_back(a);
  }
  return o;
}

JobConfig job(const Options& o, const std::vector<std::string>& layout,
              const std::vector<std::string>& extra) {
  return testing::harness_job(20, {o.common, layout, extra});
}

std::vector<std::string> saving(const Options& o, const std::string& dump) {
  return {"--job.dump_folder",
          dump,
          "--checkpoint.enable",
          "true",
          "--checkpoint.interval",
          "10",
          "--checkpoint.last_save_model_only",
          "false",
          "--checkpoint.async_mode",
          o.async ? "async" : "disabled"};
}

using Record = testing::RunResult;
Record run(Trainer& t, int steps) { return testing::run_steps(t, steps); }
using testing::rel;

// Steps [first, first + got.size()) of `got` against the same steps of `want` (1-based labels).
int compare(const char* what, const Record& got, const Record& want, size_t offset, int first,
            double tol) {
  int bad = 0;
  for (size_t i = 0; i < got.loss.size(); ++i) {
    const double dl = rel(got.loss[i], want.loss[i + offset]);
    const double dn = rel(got.grad_norm[i], want.grad_norm[i + offset]);
    std::printf(
        "%s step %2d  loss %.10f (want %.10f, rel %.2e)  grad_norm %.8f (want %.8f, rel %.2e)\n",
        what, first + int(i), got.loss[i], want.loss[i + offset], dl, got.grad_norm[i],
        want.grad_norm[i + offset], dn);
    if (!(dl <= tol) || !(dn <= tol)) ++bad;
    // Multi-token prediction: each depth's loss too.
    const std::vector<double>& gm = got.mtp_loss[i];
    const std::vector<double>& wm = want.mtp_loss[i + offset];
    if (gm.size() != wm.size()) ++bad;
    for (size_t k = 0; k < gm.size() && k < wm.size(); ++k) {
      const double dm = rel(gm[k], wm[k]);
      std::printf("%s step %2d  mtp_loss_%zu %.10f (want %.10f, rel %.2e)\n", what, first + int(i),
                  k + 1, gm[k], wm[k], dm);
      if (!(dm <= tol)) ++bad;
    }
  }
  return bad;
}

int same_layout(const Options& o, Communicator& world, const LaunchInfo& launch,
                const std::string& root) {
  const int rank = world.rank();
  std::unique_ptr<Communicator> sub = world.split(rank < o.save_np ? 0 : 1, rank, "layout");
  if (rank >= o.save_np) return 0;
  int failures = 0;
  Trainer whole(job(o, o.save, saving(o, root + "/whole")), *sub, launch);
  const Record want = run(whole, 20);
  {
    Trainer cut(job(o, o.save, saving(o, root + "/cut")), *sub, launch);
    run(cut, 10);
  }
  Trainer resumed(job(o, o.save, saving(o, root + "/cut")), *sub, launch);
  if (resumed.resumed().step != 10) {
    std::printf("rank %d: resumed at step %lld, expected 10\n", rank,
                static_cast<long long>(resumed.resumed().step));
    return 1;
  }
  const Record got = run(resumed, 10);
  if (rank == 0) failures += compare("resumed", got, want, 10, 11, 0.0);
  int differing = 0;
  for (const ParamInfo& p : whole.plan().params()) {
    Tensor a = whole.params().master_to_host(p.name), b = resumed.params().master_to_host(p.name);
    if (std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
      if (differing++ == 0) std::printf("rank %d: parameter %s differs\n", rank, p.name.c_str());
    }
  }
  if (rank == 0 && differing == 0) std::printf("final parameters: bitwise equal on rank 0\n");
  return failures + differing;
}

int reshard(const Options& o, Communicator& world, const LaunchInfo& launch,
            const std::string& root, Backend& host) {
  const int rank = world.rank();
  std::unique_ptr<Communicator> save_comm = world.split(rank < o.save_np ? 0 : 1, rank, "save");
  std::unique_ptr<Communicator> load_comm = world.split(rank < o.load_np ? 0 : 1, rank, "load");
  std::unique_ptr<Communicator> self = world.split(rank, 0, "self");
  int failures = 0;
  Record saved;
  int64_t rows = 0;  // the global batch, in rows
  if (rank < o.save_np) {
    JobConfig cfg = job(o, o.save, saving(o, root + "/save"));
    Trainer t(cfg, *save_comm, launch);
    rows = t.tokens_per_step() / cfg.training.seq_len;
    saved = run(t, 10);
  }
  std::unique_ptr<Trainer> ref;
  Record want;
  if (rank == 0) {
    ref = std::make_unique<Trainer>(
        job(o, {"--training.local_batch_size", std::to_string(rows)}, {}), *self, launch);
    want = run(*ref, 20);
    failures += compare("saving run", saved, want, 0, 1, o.tol);
  }
  world.barrier();
  if (rank < o.load_np) {
    std::vector<std::string> extra = {"--job.dump_folder",
                                      root + "/load",
                                      "--checkpoint.enable",
                                      "true",
                                      "--checkpoint.initial_load_path",
                                      root + "/save/checkpoint/step-10",
                                      "--checkpoint.initial_load_model_only",
                                      "false"};
    Trainer t(job(o, o.load, extra), *load_comm, launch);
    if (t.resumed().step != 10) {
      std::printf("rank %d: resumed at step %lld, expected 10\n", rank,
                  static_cast<long long>(t.resumed().step));
      return failures + 1;
    }
    const Record got = run(t, 10);
    if (rank == 0) failures += compare("resumed", got, want, 10, 11, o.tol);
    const testing::ParamDiff pd = testing::compare_params(t, ref.get(), *load_comm, host);
    if (!(pd.worst <= o.tol)) {
      ++failures;
      std::printf("rank %d: parameter %s differs by %.3e (tolerance %.1e)\n", rank,
                  pd.where.c_str(), pd.worst, o.tol);
    } else if (!(pd.routing <= o.tol)) {  // the resumed run must route as the uninterrupted one
      ++failures;
      std::printf(
          "rank %d: routing counter %s: %.3e of the layer's routed tokens moved "
          "(tolerance %.1e)\n",
          rank, pd.routing_where.c_str(), pd.routing, o.tol);
    } else if (rank == 0) {
      std::printf("final parameters: max relative difference %.3e on rank 0\n", pd.worst);
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  const Options o = parse(argc, argv);
  Communicator& world = rt.world();
  std::unique_ptr<Backend> host = create_backend("cpu", 0);
  const int rank = world.rank();
  const std::string root = (fs::temp_directory_path() / ("meshtrain_ckpt_" + o.name)).string();
  if (rank == 0) fs::remove_all(root);
  world.barrier();
  int failures = 0;
  try {
    failures = o.same ? same_layout(o, world, rt.launch(), root)
                      : reshard(o, world, rt.launch(), root, *host);
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    abort_all(2);
  }
  Tensor f = Tensor::from_vector(std::vector<int32_t>{failures}, Shape{1});
  world.all_reduce(f, ReduceOp::kSum, host->stream(0));
  const int total = f.data<int32_t>()[0];
  if (rank == 0) std::printf("%s\n", total == 0 ? "CHECKPOINT OK" : "CHECKPOINT FAILED");
  if (rank == 0 && total == 0) fs::remove_all(root);
  return total == 0 ? 0 : 1;
}
