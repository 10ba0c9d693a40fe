// Tensor: a typed, shaped, contiguous view (shared storage + byte offset). Tensors never own
// layout tricks: strides are always row-major, so kernels take raw pointers and extents.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/shape.h"
#include "meshtrain/tensor/allocator.h"

namespace meshtrain {

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype);

  // Fresh zero-filled tensor from an allocator (counts as an allocation).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& alloc = cpu_allocator());
  // Non-owning view of memory someone else keeps alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device);

  template <typename T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape) {
    MT_CHECK_EQ(int64_t(v.size()), shape.numel(), "Tensor::from_vector size");
    Tensor t = empty(shape, dtype_of<T>());
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
    return t;
  }
  template <typename T>
  std::vector<T> to_vector() const {
    check_host_typed(dtype_of<T>());
    const T* p = static_cast<const T*>(raw());
    return std::vector<T>(p, p + numel());
  }

  bool defined() const { return storage_ != nullptr; }
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    MT_CHECK(dtype_ == dtype_of<T>(), "tensor holds {}, accessed as {}", dtype_name(dtype_),
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  // Same memory, new shape of equal element count.
  Tensor view(const Shape& shape) const;
  // Same memory reinterpreted as another dtype of the same byte size and shape (for raw copies).
  Tensor view_as(DType dtype, const Shape& shape) const;
  // Contiguous slice of rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Points this tensor at `rows` leading rows of other memory, keeping its rank, trailing extents
  // and dtype. Allocates nothing (the shape is edited in place): for a kernel that re-views a
  // workspace which moves between steps, where making a Tensor would allocate its Shape.
  void reseat_rows(std::shared_ptr<Storage> storage, size_t byte_offset, int64_t rows);
  // Host tensors only: byte copy from another tensor of the same dtype and numel.
  void copy_from_host(const Tensor& src) const;
  // Host tensors only: read element i as double (any dtype).
  double item_as_double(int64_t i = 0) const;

 private:
  void check_host_typed(DType want) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace meshtrain
