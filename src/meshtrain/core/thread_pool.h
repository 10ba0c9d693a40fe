// A process-wide pool of worker threads for data work (tokenizing): run(job, n) calls job() on
// n threads at once (the caller is one of them) and returns when all have finished. Workers live
// for the whole process, so per-thread caches (the tokenizer's piece cache) stay warm across calls.
#pragma once

#include <functional>

namespace meshtrain {

// Runs `job` on min(threads, hardware threads) threads including the calling one; the job itself
// splits the work (e.g. by an atomic counter). Calls from several threads take turns. The first
// exception a job throws is rethrown here after every thread has finished.
void run_on_threads(const std::function<void()>& job, int threads);

}  // namespace meshtrain
