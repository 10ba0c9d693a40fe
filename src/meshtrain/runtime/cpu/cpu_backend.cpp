// The CPU backend: synchronous streams (work is done when the call returns), so events are
// only timestamps and waits are no-ops.
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "meshtrain/runtime/backend.h"

namespace meshtrain {
namespace {

class CpuStream final : public Stream {
 public:
  void* native_handle() const override { return nullptr; }
  void synchronize() override {}
};

class CpuEvent final : public Event {
 public:
  void record(Stream&) override { t_ = std::chrono::steady_clock::now(); }
  void wait(Stream&) override {}
  void synchronize() override {}
  float elapsed_ms(const Event& since) const override {
    const auto& s = static_cast<const CpuEvent&>(since);
    return std::chrono::duration<float, std::milli>(t_ - s.t_).count();
  }

 private:
  std::chrono::steady_clock::time_point t_{};
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() { ensure_streams(1); }
  Device device() const override { return Device{DeviceType::kCPU, 0}; }
  Allocator& allocator() override { return cpu_allocator(); }
  Allocator& host_staging_allocator() override { return cpu_allocator(); }
  Stream& stream(int index) override { return *streams_.at(size_t(index)); }
  int num_streams() const override { return int(streams_.size()); }
  void ensure_streams(int n) override {
    while (int(streams_.size()) < n) streams_.push_back(std::make_unique<CpuStream>());
  }
  std::unique_ptr<Event> create_event(bool) override { return std::make_unique<CpuEvent>(); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind, Stream&) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes, Stream&) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}
  std::string description() const override { return "cpu"; }
  int64_t memory_capacity() const override {
    return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  }
  double peak_flops(DType) const override { return 0.0; }

 private:
  std::vector<std::unique_ptr<CpuStream>> streams_;
};

const bool kRegistered = [] {
  register_backend("cpu", [](int) { return std::make_unique<CpuBackend>(); });
  return true;
}();

}  // namespace
}  // namespace meshtrain
