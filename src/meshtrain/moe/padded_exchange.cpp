// The padded expert exchange's kernel tables (see header) and the CPU one: plain loops on the
// calling thread (the CPU backend's streams run work in order as it is enqueued).
#include "meshtrain/moe/padded_exchange.h"

#include <array>
#include <cstring>

#include "meshtrain/core/check.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain::ops {
namespace {

std::array<EpPaddedKernels, 2>& tables() {
  static std::array<EpPaddedKernels, 2> t{};
  return t;
}

void cpu_index(EpRowMap map, const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
               int32_t* idx, Stream&) {
  const int64_t rows = ep_padded_rows(map, s);
  for (int64_t d = 0; d < rows; ++d) idx[d] = int32_t(ep_padded_source(map, s, groups, recv, d));
}

void cpu_gather(void* dst, const void* src, const int32_t* idx, int64_t rows, size_t row_bytes,
                Stream&) {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  for (int64_t d = 0; d < rows; ++d) {
    char* o = out + size_t(d) * row_bytes;
    if (idx[d] < 0)
      std::memset(o, 0, row_bytes);
    else
      std::memcpy(o, in + size_t(idx[d]) * row_bytes, row_bytes);
  }
}

void cpu_count_overflows(const EpPaddedShape& s, const int32_t* groups, const int32_t* recv,
                         float* counter, Stream&) {
  *counter += float(ep_padded_overflows(s, groups, recv));
}

}  // namespace

void register_ep_padded_kernels(DeviceType device, EpPaddedKernels kernels) {
  tables()[size_t(device)] = kernels;
}

const EpPaddedKernels& ep_padded_kernels(DeviceType device) {
  const EpPaddedKernels& k = tables()[size_t(device)];
  MT_CHECK(k.index != nullptr && k.gather != nullptr && k.count_overflows != nullptr,
           "the padded expert exchange has no kernels for device {} (a build without that "
           "backend?)",
           device == DeviceType::kCUDA ? "cuda" : "cpu");
  return k;
}

MT_REGISTER_OPS {
  register_ep_padded_kernels(
      DeviceType::kCPU,
      {.index = cpu_index, .gather = cpu_gather, .count_overflows = cpu_count_overflows});
}

}  // namespace meshtrain::ops
