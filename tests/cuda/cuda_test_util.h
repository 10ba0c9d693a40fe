// Helpers shared by the GPU tests: the process's CUDA backend (a clear failure when there is no
// GPU), device <-> host copies, arena poisoning, and executor services for one rank.
#pragma once

#include "meshtrain/graph/executor.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::cudatest {

// The CUDA backend on device 0, made on first use. Throws ConfigError (failing the test that
// asked) when this machine has no usable GPU: these tests never skip.
Backend& cuda_backend();

// A host copy of a device tensor (synchronises the backend).
Tensor to_host(Backend& be, const Tensor& device_tensor);
// A device tensor holding the host values (synchronises the backend).
Tensor to_device(Backend& be, const Tensor& host_tensor);

// Fills the executor's whole activation arena with 0xFF bytes (NaN in float32/float64/bf16,
// -1 in integers) on stream s, so an output element a kernel never writes stays visible.
void poison_arena(const Executor& ex, Stream& s);
// The same for one device buffer.
void poison(void* device_ptr, size_t bytes, Stream& s);
// Holds stream s for `ms` milliseconds from a host function (what is enqueued after it waits), so
// host waits and ordering bugs become visible.
void hold_stream(Stream& s, int ms);

// Executor services of a one-rank run: every mesh group is `comm`.
class OneRankServices final : public ExecServices {
 public:
  OneRankServices(Backend& be, Communicator& comm) : be_(be), comm_(comm) {}
  Communicator& comm(MeshGroup) override { return comm_; }
  Backend& backend() override { return be_; }

 private:
  Backend& be_;
  Communicator& comm_;
};

}  // namespace meshtrain::cudatest
