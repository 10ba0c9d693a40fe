// Allocators and the global allocation counter. Every byte meshtrain owns comes through an
// Allocator, so `allocation_count()` proves that steps after the first allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "meshtrain/core/device.h"

namespace meshtrain {

class Allocator {
 public:
  virtual ~Allocator() = default;
  void* allocate(size_t bytes);  // counted; returns 256-byte aligned memory
  void deallocate(void* p, size_t bytes);
  virtual Device device() const = 0;
  int64_t bytes_in_use() const { return bytes_in_use_; }
  int64_t peak_bytes() const { return peak_bytes_; }

 protected:
  virtual void* do_allocate(size_t bytes) = 0;
  virtual void do_deallocate(void* p, size_t bytes) = 0;

 private:
  int64_t bytes_in_use_ = 0;
  int64_t peak_bytes_ = 0;
};

// Number of allocate() calls on any allocator since the process started.
int64_t allocation_count();

Allocator& cpu_allocator();

// Owning block of device memory; tensors hold it through shared_ptr and a byte offset.
class Storage {
 public:
  Storage(Allocator& alloc, size_t bytes);
  // Non-owning wrap of external memory (for example MPI-provided or mmapped data).
  Storage(void* external, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Allocator* alloc_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

}  // namespace meshtrain
