// Device identity: a backend type and an index. CPU ranks use {kCPU, 0}; GPU ranks {kCUDA, local}.
#pragma once

#include <string>

namespace meshtrain {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// Parses "cpu" or "cuda" / "cuda:N".
Device parse_device(const std::string& s);

}  // namespace meshtrain
