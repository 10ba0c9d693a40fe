// Backend: what the executor needs from a device. Streams (0 = compute, 1.. = communication),
// events for cross-stream ordering, copies and fills, and the allocator. The CPU backend is
// synchronous; the CUDA backend maps streams and events onto CUDA's. Backends register by name,
// so model and pass code never name one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/device.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/tensor/allocator.h"

namespace meshtrain {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void* native_handle() const = 0;  // cudaStream_t on CUDA, nullptr on CPU
  virtual void synchronize() = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& s) = 0;
  virtual void wait(Stream& s) = 0;  // s waits (on the device) until the record completes
  virtual void synchronize() = 0;    // host waits
  virtual float elapsed_ms(const Event& since) const = 0;  // both recorded with timing
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  // Host memory the device can copy from/to asynchronously (pinned on CUDA).
  virtual Allocator& host_staging_allocator() = 0;
  virtual Stream& stream(int index) = 0;
  virtual int num_streams() const = 0;
  // Makes sure at least n streams exist (called before the first step, never inside one).
  virtual void ensure_streams(int n) = 0;
  virtual std::unique_ptr<Event> create_event(bool timing) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) = 0;
  virtual void fill_zero(void* dst, size_t bytes, Stream& s) = 0;
  virtual void synchronize() = 0;
  virtual std::string description() const = 0;
  // Bytes of device memory (host RAM for the CPU backend), for the memory percentage.
  virtual int64_t memory_capacity() const = 0;
  // Dense peak FLOP/s of the device for a dtype, for MFU; <= 0 when unknown (CPUs).
  virtual double peak_flops(DType dtype) const = 0;
};

using BackendFactory = std::function<std::unique_ptr<Backend>(int local_index)>;
void register_backend(const std::string& name, BackendFactory factory);
bool backend_available(const std::string& name);
std::unique_ptr<Backend> create_backend(const std::string& name, int local_index);
std::vector<std::string> available_backends();

}  // namespace meshtrain
