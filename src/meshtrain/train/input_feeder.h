// InputFeeder: moves each micro-batch from the data loader into the step graph's input tensors.
// On the CPU the loader writes them directly. On a device it writes one of two pinned staging
// buffers and enqueues the copy on the compute stream, so loading micro-batch m+1 overlaps the
// device work of micro-batch m.
#pragma once

#include <memory>

#include "meshtrain/data/loader.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

class InputFeeder {
 public:
  InputFeeder(Backend& backend, Tensor tokens, Tensor labels);
  void feed(TokenLoader& loader);

 private:
  Backend& backend_;
  Tensor tokens_, labels_;
  bool direct_ = false;
  Tensor staging_[2];  // each holds tokens then labels
  std::unique_ptr<Event> copied_[2];
  bool pending_[2] = {false, false};
  int next_ = 0;
};

}  // namespace meshtrain
