// meshtrain_dist_launch_probe: launch_local and abort_all as real processes. Parent mode
// (--nproc N) re-launches itself under mpirun and exits 0 iff the job's exit code equals
// --child-exit; child mode (the ranks) checks what a launched rank sees and exits with it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "meshtrain/core/check.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

using namespace meshtrain;

namespace {

struct Options {
  int expect_world = -1;
  int child_exit = 0;
  int throw_on_rank = -1;
  const char* expect_openblas = nullptr;
  bool unset_openblas = false;
  bool expect_no_mpirun = false;
  const char* expect_launch_error = nullptr;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : (char*)""; };
    if (a == "--expect-world")
      o.expect_world = std::atoi(next());
    else if (a == "--child-exit")
      o.child_exit = std::atoi(next());
    else if (a == "--throw-on-rank")
      o.throw_on_rank = std::atoi(next());
    else if (a == "--expect-openblas")
      o.expect_openblas = next();
    else if (a == "--unset-openblas")
      o.unset_openblas = true;
    else if (a == "--expect-no-mpirun")
      o.expect_no_mpirun = true;
    else if (a == "--expect-launch-error")
      o.expect_launch_error = next();
  }
  return o;
}

int parent(int nproc, int argc, char** argv, const Options& o) {
  if (o.unset_openblas) ::unsetenv("OPENBLAS_NUM_THREADS");
  if (o.expect_no_mpirun) {
    ::setenv("PATH", "/nonexistent-meshtrain-dir", 1);
    try {
      launch_local(nproc, argc, argv);
    } catch (const ConfigError& e) {
      bool ok = e.message().find(
                    "starts ranks with mpirun, which is not on PATH "
                    "('/nonexistent-meshtrain-dir')") != std::string::npos;
      std::printf("probe: %s -> %s\n", e.what(), ok ? "expected" : "WRONG MESSAGE");
      return ok ? 0 : 1;
    }
    std::printf("probe: launch_local without mpirun did not throw\n");
    return 1;
  }
  int rc = launch_local(nproc, argc, argv);
  std::printf("probe: job exited with %d, expected %d\n", rc, o.child_exit);
  return rc == o.child_exit ? 0 : 1;
}

// A launch the MPI communicator cannot serve (torchrun with WORLD_SIZE > 1, or an srun step
// this MPI cannot join) must fail with a ConfigError that says how to launch instead.
int expect_launch_error(int argc, char** argv, const char* want) {
  try {
    Runtime rt(&argc, &argv);
    rt.world();
  } catch (const ConfigError& e) {
    bool ok = e.message().find(want) != std::string::npos;
    std::printf("probe: %s -> %s\n", e.what(), ok ? "expected" : "WRONG MESSAGE");
    return ok ? 0 : 1;
  }
  std::printf("probe: expected a ConfigError containing '%s'\n", want);
  return 1;
}

int child(int argc, char** argv, const Options& o) {
  Runtime rt(&argc, &argv);
  auto cpu = create_backend("cpu", 0);
  Communicator& w = rt.world();
  int bad = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "probe rank %d: %s\n", rt.rank(), what.c_str());
      bad = 1;
    }
  };
  check(rt.launch().launcher == "mpirun", "launcher is " + rt.launch().launcher);
  check(o.expect_world < 0 || w.size() == o.expect_world, "world size " + std::to_string(w.size()));
  for (int i = 1; i < argc; ++i)
    check(std::strncmp(argv[i], "--nproc", 7) != 0, "rank saw --nproc");
  const char* ob = std::getenv("OPENBLAS_NUM_THREADS");
  check(!o.expect_openblas || (ob && std::strcmp(ob, o.expect_openblas) == 0),
        std::string("OPENBLAS_NUM_THREADS=") + (ob ? ob : "<unset>"));
  Tensor one = Tensor::from_vector<int32_t>({1}, Shape{1});
  w.all_reduce(one, ReduceOp::kSum, cpu->stream(0));
  check(one.data<int32_t>()[0] == w.size(), "all_reduce of ones");
  if (o.throw_on_rank >= 0) {
    if (rt.rank() == o.throw_on_rank)
      MT_THROW(ValueError, "probe: rank {} throws on purpose", rt.rank());
    w.barrier();  // never completes: the thrower does not arrive; abort_all must end us
    std::fprintf(stderr, "probe rank %d: passed a barrier a rank never reached\n", rt.rank());
    return 101;
  }
  return bad ? 100 : o.child_exit;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  int world_size = 1;
  try {
    int nproc = nproc_from_args(argc, argv);
    if (nproc > 0) return parent(nproc, argc, argv, o);
    if (o.expect_launch_error) return expect_launch_error(argc, argv, o.expect_launch_error);
    world_size = detect_launch().world_size;
    return child(argc, argv, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe: %s\n", e.what());
    if (world_size > 1) abort_all(o.child_exit);
    return 1;
  }
}
