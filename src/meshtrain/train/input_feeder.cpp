// InputFeeder (see header).
#include "meshtrain/train/input_feeder.h"

namespace meshtrain {

InputFeeder::InputFeeder(Backend& backend, Tensor tokens, Tensor labels)
    : backend_(backend), tokens_(std::move(tokens)), labels_(std::move(labels)) {
  direct_ = tokens_.device().is_cpu();
  if (direct_) return;
  for (int k = 0; k < 2; ++k) {
    staging_[k] = Tensor::empty(Shape{tokens_.numel() + labels_.numel()}, DType::kI32,
                                backend_.host_staging_allocator());
    copied_[k] = backend_.create_event(false);
  }
}

void InputFeeder::feed(TokenLoader& loader) {
  if (direct_) {
    loader.next(tokens_.data<int32_t>(), labels_.data<int32_t>());
    return;
  }
  int k = next_;
  next_ ^= 1;
  // Host wait: staging buffer k may still be read by the copy enqueued two micro-batches ago.
  if (pending_[k]) copied_[k]->synchronize();
  int32_t* host = staging_[k].data<int32_t>();
  loader.next(host, host + tokens_.numel());
  Stream& s = backend_.stream(0);
  backend_.copy(tokens_.raw(), host, tokens_.nbytes(), CopyKind::kHostToDevice, s);
  backend_.copy(labels_.raw(), host + tokens_.numel(), labels_.nbytes(), CopyKind::kHostToDevice,
                s);
  copied_[k]->record(s);
  pending_[k] = true;
}

}  // namespace meshtrain
