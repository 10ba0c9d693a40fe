// GPU test helpers (see header).
#include "cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {

Backend& cuda_backend() {
  static std::unique_ptr<Backend> be = [] {
    MT_CHECK_T(ConfigError, backend_available("cuda"),
               "the GPU tests need a CUDA device, and the cuda backend did not register (no GPU "
               "visible or no driver); run them on a GPU machine (scripts/gpu_test.sh)");
    return create_backend("cuda", 0);
  }();
  return *be;
}

Tensor to_host(Backend& be, const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), d.dtype());
  be.synchronize();
  be.copy(h.raw(), d.raw(), d.nbytes(), CopyKind::kDeviceToHost, be.stream(0));
  be.synchronize();
  return h;
}

Tensor to_device(Backend& be, const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), be.allocator());
  be.copy(d.raw(), h.raw(), h.nbytes(), CopyKind::kHostToDevice, be.stream(0));
  be.synchronize();
  return d;
}

namespace {
void CUDART_CB sleep_ms(void* ms) {  // the duration travels in the pointer: no lifetime to keep
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}
}  // namespace

void hold_stream(Stream& s, int ms) {
  CUDA_CHECK(cudaLaunchHostFunc(native_stream(s), sleep_ms,
                                reinterpret_cast<void*>(static_cast<intptr_t>(ms))));
}

void poison(void* p, size_t bytes, Stream& s) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, native_stream(s)));
}

void poison_arena(const Executor& ex, Stream& s) {
  const Graph& g = ex.graph();
  for (ValueId v = 0; v < g.num_values(); ++v) {
    if (ex.plan().region[size_t(v)] != MemRegion::kArena) continue;
    // Any arena value's storage is the whole arena (activations and node workspaces).
    const auto& st = ex.tensor(v).storage();
    poison(st->data(), st->bytes(), s);
    return;
  }
}

}  // namespace meshtrain::cudatest
