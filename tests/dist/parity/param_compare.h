// Final-parameter comparison shared by the parity and checkpoint tests: rank 0 of `comm` holds a
// reference trainer (any layout it can read whole tensors from: one rank), broadcasts each global
// tensor, and every rank checks its shard of `got` against the same slice; padding must be zero.
#pragma once

#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::testing {

struct ParamDiff {
  double worst = 0;   // max |x - ref| / (1 + |ref|) over this rank's elements (1 for bad padding)
  std::string where;  // "name[flat index]" of the worst element (flat -1: padding)
};

// `ref` is read on rank 0 of comm only (may be null elsewhere); its masters must be whole.
ParamDiff compare_params(const Trainer& got, const Trainer* ref, Communicator& comm, Backend& host);

}  // namespace meshtrain::testing
