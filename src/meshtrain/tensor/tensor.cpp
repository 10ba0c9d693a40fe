// Tensor views and host helpers.
#include "meshtrain/tensor/tensor.h"

#include <cstring>

namespace meshtrain {

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)), dtype_(dtype) {
  MT_CHECK(storage_ == nullptr || offset_ + nbytes() <= storage_->bytes(),
           "view of {} bytes at offset {} exceeds storage of {} bytes", nbytes(), offset_,
           storage_->bytes());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& alloc) {
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  return Tensor(std::make_shared<Storage>(alloc, bytes), 0, shape, dtype);
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  return Tensor(std::make_shared<Storage>(data, bytes, device), 0, shape, dtype);
}

Tensor Tensor::view(const Shape& shape) const {
  MT_CHECK_T(ShapeError, shape.numel() == numel(), "view {} of tensor {}: element counts differ",
             shape, shape_);
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::view_as(DType dtype, const Shape& shape) const {
  MT_CHECK(size_t(shape.numel()) * dtype_size(dtype) == nbytes(), "view_as {} {} of {} bytes",
           dtype_name(dtype), shape, nbytes());
  return Tensor(storage_, offset_, shape, dtype);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MT_CHECK_T(ShapeError, shape_.rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
             "slice_rows [{}, {}) of shape {}", begin, end, shape_);
  int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  return Tensor(storage_, offset_ + size_t(begin * row) * dtype_size(dtype_),
                shape_.with(0, end - begin), dtype_);
}

void Tensor::reseat_rows(std::shared_ptr<Storage> storage, size_t byte_offset, int64_t rows) {
  MT_CHECK_T(ShapeError, shape_.rank() >= 1 && rows >= 0,
             "reseat_rows: {} rows for a tensor of shape {} (rank >= 1 needed)", rows, shape_);
  int64_t per_row = 1;
  for (int d = 1; d < shape_.rank(); ++d) per_row *= shape_[d];
  const size_t bytes = size_t(rows * per_row) * dtype_size(dtype_);
  // Checked before anything changes: a refused reseat leaves the tensor as it was.
  MT_CHECK(storage == nullptr || byte_offset + bytes <= storage->bytes(),
           "reseat_rows: {} bytes at offset {} exceed storage of {} bytes", bytes, byte_offset,
           storage->bytes());
  shape_[0] = rows;
  storage_ = std::move(storage);
  offset_ = byte_offset;
}

void Tensor::check_host_typed(DType want) const {
  MT_CHECK(defined(), "undefined tensor");
  MT_CHECK(device().is_cpu(), "host access to a {} tensor", device().to_string());
  MT_CHECK(dtype_ == want, "tensor holds {}, read as {}", dtype_name(dtype_), dtype_name(want));
}

void Tensor::copy_from_host(const Tensor& src) const {
  MT_CHECK(device().is_cpu() && src.device().is_cpu(), "copy_from_host on device tensors");
  MT_CHECK(src.dtype_ == dtype_ && src.numel() == numel(), "copy {} {} into {} {}",
           dtype_name(src.dtype_), src.shape_, dtype_name(dtype_), shape_);
  std::memcpy(raw(), src.raw(), nbytes());
}

double Tensor::item_as_double(int64_t i) const {
  MT_CHECK(device().is_cpu(), "item on a {} tensor", device().to_string());
  MT_CHECK(i >= 0 && i < numel(), "item {} of {} elements", i, numel());
  switch (dtype_) {
    case DType::kF32: return static_cast<const float*>(raw())[i];
    case DType::kF64: return static_cast<const double*>(raw())[i];
    case DType::kBF16: return float(static_cast<const BFloat16*>(raw())[i]);
    case DType::kI32: return static_cast<const int32_t*>(raw())[i];
    case DType::kI64: return double(static_cast<const int64_t*>(raw())[i]);
  }
  return 0;
}

}  // namespace meshtrain
