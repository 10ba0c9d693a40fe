// Counter-based random numbers (Philox-4x32-10). Element i of a tensor is a pure function of
// (seed, stream, i), so any shard of a global tensor can be generated on its own and is
// bit-identical to the same slice of the full tensor generated on one rank.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace meshtrain {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Stable 64-bit hash of a name (FNV-1a), used to give each parameter its own stream.
uint64_t stable_hash(std::string_view s);

// Uniform in (0, 1) from 32 random bits (never exactly 0 or 1).
inline double uniform_open(uint32_t bits_hi, uint32_t bits_lo) {
  uint64_t x = (uint64_t(bits_hi) << 21) ^ uint64_t(bits_lo >> 11);
  x &= (uint64_t(1) << 53) - 1;
  return (double(x) + 0.5) / double(uint64_t(1) << 53);
}

// Standard normal for element `index` of stream `stream`; `attempt` selects a fresh draw
// (used by truncated sampling).
double normal_at(uint64_t seed, uint64_t stream, uint64_t index, uint32_t attempt = 0);

}  // namespace meshtrain
