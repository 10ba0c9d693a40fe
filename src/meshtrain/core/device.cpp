// Device parsing.
#include "meshtrain/core/device.h"

#include "meshtrain/core/check.h"

namespace meshtrain {
Device parse_device(const std::string& s) {
  if (s == "cpu") return Device{DeviceType::kCPU, 0};
  if (s == "cuda") return Device{DeviceType::kCUDA, 0};
  if (s.rfind("cuda:", 0) == 0) return Device{DeviceType::kCUDA, std::stoi(s.substr(5))};
  MT_THROW(ConfigError, "unknown device '{}': expected 'cpu' or 'cuda'", s);
}
}  // namespace meshtrain
