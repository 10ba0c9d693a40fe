// Philox-4x32-10 (Salmon et al., SC'11) and the normal transform (Box-Muller on one counter).
#include "meshtrain/core/random.h"

namespace meshtrain {
namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

uint64_t stable_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

double normal_at(uint64_t seed, uint64_t stream, uint64_t index, uint32_t attempt) {
  auto r = philox4x32(seed ^ (stream * 0x9E3779B97F4A7C15ull),
                      (uint64_t(attempt) << 32) | (stream >> 32), index);
  double u1 = uniform_open(r[0], r[1]);
  double u2 = uniform_open(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace meshtrain
