// CPU allocator (aligned, zero-initialised) and allocation accounting.
#include "meshtrain/tensor/allocator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {
std::atomic<int64_t> g_allocations{0};

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device{DeviceType::kCPU, 0}; }

 protected:
  void* do_allocate(size_t bytes) override {
    size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    MT_CHECK_T(ValueError, p != nullptr, "host allocation of {} bytes failed (out of memory)",
               bytes);
    std::memset(p, 0, rounded == 0 ? 256 : rounded);
    return p;
  }
  void do_deallocate(void* p, size_t) override { std::free(p); }
};
}  // namespace

void* Allocator::allocate(size_t bytes) {
  ++g_allocations;
  void* p = do_allocate(bytes);
  bytes_in_use_ += int64_t(bytes);
  if (bytes_in_use_ > peak_bytes_) peak_bytes_ = bytes_in_use_;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  do_deallocate(p, bytes);
  bytes_in_use_ -= int64_t(bytes);
}

int64_t allocation_count() { return g_allocations.load(); }

Allocator& cpu_allocator() {
  static CpuAllocator alloc;
  return alloc;
}

Storage::Storage(Allocator& alloc, size_t bytes)
    : alloc_(&alloc), data_(alloc.allocate(bytes)), bytes_(bytes), device_(alloc.device()) {}

Storage::Storage(void* external, size_t bytes, Device device)
    : data_(external), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (alloc_) alloc_->deallocate(data_, bytes_);
}

}  // namespace meshtrain
