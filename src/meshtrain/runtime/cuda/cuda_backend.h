// The CUDA backend: one GPU per process, chosen by local rank. Stream 0 is the compute stream;
// streams 1.. (communication) are created by ensure_streams with a higher priority. All streams
// are non-blocking (they never synchronise with the legacy default stream). Device memory comes
// from cudaMalloc through a counted Allocator, which the executor calls only before step 1.
// Host waits poll (see SyncWatcher) so a hung collective becomes an error instead of a hang.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/runtime/backend.h"

namespace meshtrain {

// True when the CUDA runtime reports at least one device. Never throws: a missing driver, a
// driver older than the runtime, or no GPU all read as "no device".
bool cuda_device_present();

// The device a process with this local rank uses (core/gpu_sharing.h gpu_for_local_rank): in the
// shared-GPU test mode local_rank % GPUs; else device 0 when one GPU is visible (the launcher
// masked the others with CUDA_VISIBLE_DEVICES), else device local_rank. ConfigError when there
// is no GPU or too few for the local rank (the message suggests --share-gpu).
int cuda_device_for_local_rank(int local_rank);

// The cudaStream_t behind a backend stream (nullptr for CPU streams).
inline cudaStream_t native_stream(const Stream& s) {
  return static_cast<cudaStream_t>(s.native_handle());
}

// Something that can turn a long host wait into an error: the NCCL communicators register one,
// which checks NCCL's asynchronous errors and the age of their outstanding collectives.
// poll() runs on the waiting thread while a CUDA backend wait (stream, event or device
// synchronize) has lasted `waited_s` seconds; it throws to end the wait.
class SyncWatcher {
 public:
  virtual ~SyncWatcher() = default;
  virtual void poll(double waited_s) = 0;
};
void add_sync_watcher(SyncWatcher* w);
void remove_sync_watcher(SyncWatcher* w);

class CudaBackend final : public Backend {
 public:
  // local_index: the launcher's local rank (see cuda_device_for_local_rank).
  explicit CudaBackend(int local_index);
  ~CudaBackend() override;

  Device device() const override { return Device{DeviceType::kCUDA, device_}; }
  Allocator& allocator() override;
  Allocator& host_staging_allocator() override;
  Stream& stream(int index) override;
  int num_streams() const override { return int(streams_.size()); }
  void ensure_streams(int n) override;
  std::unique_ptr<Event> create_event(bool timing) override;
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) override;
  void fill_zero(void* dst, size_t bytes, Stream& s) override;
  void synchronize() override;
  std::string description() const override;
  int64_t memory_capacity() const override;
  double peak_flops(DType dtype) const override;

  int device_index() const { return device_; }
  const cudaDeviceProp& properties() const { return props_; }
  // cudaMalloc calls made through this backend's allocator (tests: none after prepare()).
  int64_t device_malloc_count() const;

 private:
  int device_ = 0;
  cudaDeviceProp props_{};
  int priority_low_ = 0, priority_high_ = 0;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::unique_ptr<Allocator> device_alloc_, host_alloc_;
};

// Dense peak FLOP/s from a device's name, compute capability and SM count (0 when unknown):
// exposed for tests, which cannot construct a device.
double cuda_peak_flops(const std::string& name, int cc_major, int cc_minor, int sm_count,
                       DType dtype);

// Host waits that poll the registered SyncWatchers while the stream / event is not done (a
// blocking cudaStreamSynchronize when none is registered). `what` names the wait in errors.
void cuda_wait_stream(cudaStream_t s, const char* what);
void cuda_wait_event(cudaEvent_t e, const char* what);

}  // namespace meshtrain
