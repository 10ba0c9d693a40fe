// The `--nproc N` local launcher: re-executes this binary under `mpirun -np N` and forwards the
// exit code. It never changes how ranks run, only who starts them, so `--nproc N` and
// `mpirun -np N` give the same job.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "meshtrain/core/check.h"
#include "meshtrain/launch/bootstrap.h"

extern char** environ;

namespace meshtrain {
namespace {

int parse_nproc_value(const char* v) {
  errno = 0;
  char* end = nullptr;
  long n = v ? std::strtol(v, &end, 10) : 0;
  MT_CHECK_T(ConfigError,
             v && *v && errno == 0 && end != v && *end == '\0' && n >= 1 && n <= 1 << 20,
             "--nproc expects a positive integer, found '{}'", v ? v : "");
  return int(n);
}

bool is_executable_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_forwarded = 0;
// The parent only waits; signals meant for the job go to mpirun. OpenMPI's mpirun does not forward
// SIGTERM or SIGINT: it tears the job down (SIGCONT, odls_base_sigkill_timeout = 1 s, SIGTERM,
// 1 s, SIGKILL), too soon for a rank to finish its step and save. It forwards SIGUSR2 at once,
// which ranks take as a stop request: the first two signals go as SIGUSR2 (stop after the step;
// exit now), a third as itself (mpirun's teardown).
void forward_signal(int sig) {
  if (g_child <= 0) return;
  const sig_atomic_t n = g_forwarded + 1;
  g_forwarded = n;
  ::kill(pid_t(g_child), n <= 2 ? SIGUSR2 : sig);
}

}  // namespace

int nproc_from_args(int argc, char** argv) {
  int found = 0;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    int n = 0;
    if (std::strcmp(a, "--nproc") == 0) {
      n = parse_nproc_value(i + 1 < argc ? argv[i + 1] : nullptr);
      ++i;
    } else if (std::strncmp(a, "--nproc=", 8) == 0) {
      n = parse_nproc_value(a + 8);
    } else {
      continue;
    }
    MT_CHECK_T(ConfigError, found == 0, "--nproc given twice ({} and {})", found, n);
    found = n;
  }
  return found;
}

std::vector<std::string> args_without_nproc(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--nproc") == 0) {
      ++i;  // and its value
      continue;
    }
    if (std::strncmp(argv[i], "--nproc=", 8) == 0) continue;
    out.emplace_back(argv[i]);
  }
  return out;
}

std::string find_on_path(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  size_t i = 0;
  while (true) {
    size_t end = p.find(':', i);
    size_t n = end == std::string::npos ? p.size() - i : end - i;
    // An empty PATH entry means the current directory.
    std::string candidate = (n == 0 ? std::string(".") : p.substr(i, n)) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) return "";
    i = end + 1;
  }
}

std::vector<std::string> local_launch_command(const std::string& mpirun, int nproc,
                                              const std::string& exe,
                                              const std::vector<std::string>& args, bool as_root,
                                              bool share_gpu) {
  std::vector<std::string> cmd{mpirun, "-np", std::to_string(nproc), "--oversubscribe"};
  if (as_root) cmd.push_back("--allow-run-as-root");
  // Ranks may outnumber cores on a laptop; binding would stack them on the same core.
  for (const char* a : {"--bind-to", "none", "-x", "OPENBLAS_NUM_THREADS"}) cmd.push_back(a);
  // Every rank sets its own NCCL variables from the switch (Runtime), remote nodes included.
  if (share_gpu) cmd.insert(cmd.end(), {"-x", kShareGpuVar});
  cmd.push_back(exe);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

int launch_local(int nproc, int argc, char** argv) {
  MT_CHECK_T(ConfigError, nproc >= 1, "--nproc expects a positive integer, found {}", nproc);
  LaunchInfo li = detect_launch();
  MT_CHECK_T(ConfigError, li.launcher == "none",
             "--nproc {} starts its own ranks, but this process was already launched by {} "
             "(rank {} of {}); drop --nproc",
             nproc, li.launcher, li.rank, li.world_size);
  std::string mpirun = find_on_path("mpirun");
  const char* path = std::getenv("PATH");
  MT_CHECK_T(ConfigError, !mpirun.empty(),
             "--nproc {} starts ranks with mpirun, which is not on PATH ('{}'); install "
             "OpenMPI's mpirun (openmpi-bin) or launch with mpirun, srun or torchrun yourself",
             nproc, path ? path : "");

  // /proc/self/exe must be resolved here: inside mpirun it would name mpirun itself.
  char exe[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  MT_CHECK_T(IoError, len > 0, "--nproc: cannot resolve /proc/self/exe: {}", std::strerror(errno));
  exe[len] = '\0';

  // One BLAS thread per rank unless the user chose otherwise: N ranks already fill the cores.
  ::setenv("OPENBLAS_NUM_THREADS", "1", 0);
  std::vector<std::string> cmd = local_launch_command(
      mpirun, nproc, exe, args_without_nproc(argc, argv), ::geteuid() == 0, share_gpu_requested());
  std::vector<char*> cargv;
  for (auto& s : cmd) cargv.push_back(s.data());
  cargv.push_back(nullptr);

  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, mpirun.c_str(), nullptr, nullptr, cargv.data(), environ);
  MT_CHECK_T(IoError, rc == 0, "--nproc: could not start {}: {}", mpirun, std::strerror(rc));
  g_child = pid;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  int status = 0;
  pid_t w = 0;
  do {
    w = ::waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_child = 0;
  MT_CHECK_T(IoError, w == pid, "--nproc: waiting for {} failed: {}", mpirun, std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace meshtrain
