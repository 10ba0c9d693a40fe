// The CUDA backend (see header): device selection, counted allocators, prioritised streams,
// events, async copies, polling host waits, and the registration as backend "cuda".
#include "meshtrain/runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "meshtrain/core/check.h"
#include "meshtrain/core/gpu_sharing.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain {
namespace {

// ---- sync watchers ------------------------------------------------------------------------
// Never destroyed: communicators may unregister during static destruction.
std::mutex& watcher_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<SyncWatcher*>& watchers() {
  static auto* w = new std::vector<SyncWatcher*>;
  return *w;
}

void poll_watchers(double waited_s) {
  // Copy under the lock: poll() may throw, and a watcher may unregister while we iterate.
  std::vector<SyncWatcher*> ws;
  {
    std::lock_guard<std::mutex> lock(watcher_mutex());
    ws = watchers();
  }
  for (SyncWatcher* w : ws) w->poll(waited_s);
}

bool have_watchers() {
  std::lock_guard<std::mutex> lock(watcher_mutex());
  return !watchers().empty();
}

// Spins briefly (most waits end within microseconds), then sleeps with a growing interval capped
// at 200 µs, polling watchers every 10 ms of waiting.
template <typename Query>
void wait_polling(Query&& query, const char* what, const char* call) {
  cudaError_t rc = query();
  if (rc == cudaSuccess) return;
  if (rc != cudaErrorNotReady) detail::throw_cuda_error(call, rc, __FILE__, __LINE__);
  const auto start = std::chrono::steady_clock::now();
  auto next_poll = start + std::chrono::milliseconds(10);
  int64_t sleep_us = 0;
  for (;;) {
    rc = query();
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady)
      throw CudaError(fmt::format("{} while waiting for {}: {} ({})", call, what,
                                  cudaGetErrorString(rc), cudaGetErrorName(rc)),
                      __FILE__, __LINE__);
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_poll) {
      poll_watchers(std::chrono::duration<double>(now - start).count());
      next_poll = now + std::chrono::milliseconds(10);
    }
    if (sleep_us == 0) {
      std::this_thread::yield();
      if (now - start > std::chrono::microseconds(50)) sleep_us = 5;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min<int64_t>(sleep_us * 2, 200);
    }
  }
}

// ---- allocators ---------------------------------------------------------------------------
class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(int device) : device_(device) {}
  Device device() const override { return Device{DeviceType::kCUDA, device_}; }
  int64_t mallocs() const { return mallocs_; }

 protected:
  void* do_allocate(size_t bytes) override {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 256);
    CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t rc = cudaMalloc(&p, n);
    if (rc == cudaErrorMemoryAllocation) {
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();  // clear the allocation error before querying
      cudaMemGetInfo(&free_b, &total_b);
      MT_THROW(CudaError,
               "out of GPU memory on cuda:{}: cudaMalloc of {:.3f} GiB failed with {:.3f} GiB "
               "free of {:.3f} GiB (this allocator holds {:.3f} GiB); lower local_batch_size or "
               "seq_len, or shard more (data_parallel_shard_degree)",
               device_, double(n) / (1ull << 30), double(free_b) / (1ull << 30),
               double(total_b) / (1ull << 30), double(bytes_in_use()) / (1ull << 30));
    }
    CUDA_CHECK(rc);
    ++mallocs_;
    // Allocators hand out zeroed memory (the CPU one does too). cudaMemset runs on the legacy
    // stream, which our non-blocking streams do not wait for, hence the device sync: this
    // happens only before the first step.
    CUDA_CHECK(cudaMemset(p, 0, n));
    CUDA_CHECK(cudaDeviceSynchronize());
    return p;
  }
  void do_deallocate(void* p, size_t) override {
    // cudaFree synchronises the device, so no kernel still reads the block. Called from
    // destructors: report, never throw.
    cudaError_t rc = cudaFree(p);
    if (rc != cudaSuccess) log_warn("cudaFree failed: {}", cudaGetErrorString(rc));
  }

 private:
  int device_;
  int64_t mallocs_ = 0;
};

class CudaPinnedAllocator final : public Allocator {
 public:
  Device device() const override { return Device{DeviceType::kCPU, 0}; }

 protected:
  void* do_allocate(size_t bytes) override {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 256);
    CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocPortable));
    std::memset(p, 0, n);
    return p;
  }
  void do_deallocate(void* p, size_t) override {
    // A copy may still read this buffer: wait for the device before the pages go away.
    cudaError_t rc = cudaDeviceSynchronize();
    if (rc == cudaSuccess) rc = cudaFreeHost(p);
    if (rc != cudaSuccess)
      log_warn("freeing pinned host memory failed: {}", cudaGetErrorString(rc));
  }
};

// ---- streams and events -------------------------------------------------------------------
class CudaStream final : public Stream {
 public:
  CudaStream(int priority, int index) : name_(fmt::format("stream {}", index)) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  ~CudaStream() override {
    if (s_) cudaStreamDestroy(s_);
  }
  void* native_handle() const override { return s_; }
  void synchronize() override { cuda_wait_stream(s_, name_.c_str()); }

 private:
  std::string name_;
  cudaStream_t s_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(bool timing) : timing_(timing) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override {
    if (e_) cudaEventDestroy(e_);
  }
  void record(Stream& s) override { CUDA_CHECK(cudaEventRecord(e_, native_stream(s))); }
  void wait(Stream& s) override { CUDA_CHECK(cudaStreamWaitEvent(native_stream(s), e_, 0)); }
  void synchronize() override { cuda_wait_event(e_, "an event"); }
  float elapsed_ms(const Event& since) const override {
    const auto& start = static_cast<const CudaEvent&>(since);
    MT_CHECK(timing_ && start.timing_, "elapsed_ms needs two events created with timing");
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
  bool timing_;
};

cudaMemcpyKind memcpy_kind(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

}  // namespace

// ---- free functions -----------------------------------------------------------------------
bool cuda_device_present() {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // leave no sticky state behind for later calls
    return false;
  }
  return n > 0;
}

void add_sync_watcher(SyncWatcher* w) {
  std::lock_guard<std::mutex> lock(watcher_mutex());
  watchers().push_back(w);
}

void remove_sync_watcher(SyncWatcher* w) {
  std::lock_guard<std::mutex> lock(watcher_mutex());
  auto& ws = watchers();
  ws.erase(std::remove(ws.begin(), ws.end(), w), ws.end());
}

void cuda_wait_stream(cudaStream_t s, const char* what) {
  if (!have_watchers()) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  wait_polling([s] { return cudaStreamQuery(s); }, what, "cudaStreamQuery");
}

void cuda_wait_event(cudaEvent_t e, const char* what) {
  if (!have_watchers()) {
    CUDA_CHECK(cudaEventSynchronize(e));
    return;
  }
  wait_polling([e] { return cudaEventQuery(e); }, what, "cudaEventQuery");
}

double cuda_peak_flops(const std::string& name, int major, int minor, int sms, DType dtype) {
  // Only dense bf16 on Hopper is known here (the datasheet rate scales with SM count x clock:
  // SXM H100/H200 with 132 SMs at 1.83 GHz boost = 989.5 TFLOP/s; PCIe H100, 114 SMs at 1.755
  // GHz = 756 TFLOP/s). Other dtypes depend on which kernels run (TF32 or not): unknown.
  if (dtype != DType::kBF16 || major != 9 || minor != 0) return 0.0;
  const bool hopper = name.find("H100") != std::string::npos ||
                      name.find("H200") != std::string::npos ||
                      name.find("H800") != std::string::npos;
  if (!hopper) return 0.0;
  if (sms == 132) return 989.5e12;
  if (sms == 114) return 756.0e12;
  return 0.0;
}

int cuda_device_for_local_rank(int local_rank) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  MT_CHECK_T(ConfigError, rc == cudaSuccess && count > 0,
             "no usable GPU: cudaGetDeviceCount reports {} ({})", count,
             rc == cudaSuccess ? "no device" : cudaGetErrorString(rc));
  return gpu_for_local_rank(local_rank, count, share_gpu_requested());
}

// ---- CudaBackend --------------------------------------------------------------------------
CudaBackend::CudaBackend(int local_index) {
  device_ = cuda_device_for_local_rank(local_index);
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low_, &priority_high_));
  device_alloc_ = std::make_unique<CudaDeviceAllocator>(device_);
  host_alloc_ = std::make_unique<CudaPinnedAllocator>();
  ensure_streams(1);
}

CudaBackend::~CudaBackend() {
  // Work may still run on our streams; finish it before they and the allocators go away.
  cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) log_warn("cuda backend shutdown: {}", cudaGetErrorString(rc));
  streams_.clear();
}

Allocator& CudaBackend::allocator() { return *device_alloc_; }
Allocator& CudaBackend::host_staging_allocator() { return *host_alloc_; }

Stream& CudaBackend::stream(int index) {
  MT_CHECK(index >= 0 && index < int(streams_.size()), "stream {} requested, {} exist", index,
           streams_.size());
  return *streams_[size_t(index)];
}

void CudaBackend::ensure_streams(int n) {
  CUDA_CHECK(cudaSetDevice(device_));
  while (int(streams_.size()) < n) {
    const int index = int(streams_.size());
    // Communication streams get the higher priority: a collective's few blocks should start as
    // soon as its inputs are ready rather than queue behind a wave of compute blocks.
    const int priority = index == 0 ? priority_low_ : priority_high_;
    streams_.push_back(std::make_unique<CudaStream>(priority, index));
  }
}

std::unique_ptr<Event> CudaBackend::create_event(bool timing) {
  return std::make_unique<CudaEvent>(timing);
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), native_stream(s)));
}

void CudaBackend::fill_zero(void* dst, size_t bytes, Stream& s) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, native_stream(s)));
}

void CudaBackend::synchronize() {
  for (auto& s : streams_) s->synchronize();
  // Anything enqueued outside our streams (libraries' internal streams).
  CUDA_CHECK(cudaDeviceSynchronize());
}

std::string CudaBackend::description() const {
  return fmt::format("{} (cuda:{}, {:.1f} GiB, {} SMs, compute capability {}.{})", props_.name,
                     device_, double(props_.totalGlobalMem) / double(1ull << 30),
                     props_.multiProcessorCount, props_.major, props_.minor);
}

int64_t CudaBackend::memory_capacity() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return int64_t(total_b);
}

double CudaBackend::peak_flops(DType dtype) const {
  return cuda_peak_flops(props_.name, props_.major, props_.minor, props_.multiProcessorCount,
                         dtype);
}

int64_t CudaBackend::device_malloc_count() const {
  return static_cast<const CudaDeviceAllocator&>(*device_alloc_).mallocs();
}

namespace {
const bool kRegistered = [] {
  // Registered only where a GPU is visible, so "auto" resolves to cpu on GPU-less machines even
  // in a CUDA build.
  if (cuda_device_present())
    register_backend("cuda", [](int local) { return std::make_unique<CudaBackend>(local); });
  return true;
}();
}  // namespace

}  // namespace meshtrain
