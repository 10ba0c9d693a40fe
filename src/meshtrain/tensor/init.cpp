// init_local: each element's value depends only on (seed, parameter name, global flat index).
#include "meshtrain/tensor/init.h"

#include "meshtrain/core/random.h"

namespace meshtrain {

std::string InitSpec::to_string() const {
  switch (kind) {
    case Kind::kZeros: return "zeros";
    case Kind::kOnes: return "ones";
    case Kind::kConstant: return fmt::format("constant({})", value);
    case Kind::kNormal: return fmt::format("normal(mean={}, std={})", mean, std);
    case Kind::kTruncNormal: return fmt::format("trunc_normal(std={}, a={}, b={})", std, a, b);
  }
  return "?";
}

namespace {
double value_at(const InitSpec& s, uint64_t seed, uint64_t stream, uint64_t index) {
  switch (s.kind) {
    case InitSpec::Kind::kZeros: return 0.0;
    case InitSpec::Kind::kOnes: return 1.0;
    case InitSpec::Kind::kConstant: return s.value;
    case InitSpec::Kind::kNormal: return s.mean + s.std * normal_at(seed, stream, index);
    case InitSpec::Kind::kTruncNormal:
      // Rejection sampling with per-element attempts keeps each element independent of others.
      for (uint32_t attempt = 0; attempt < 1000; ++attempt) {
        double v = s.mean + s.std * normal_at(seed, stream, index, attempt);
        if (v >= s.a && v <= s.b) return v;
      }
      MT_THROW(ValueError, "trunc_normal bounds [{}, {}] with std {} reject every sample", s.a,
               s.b, s.std);
  }
  return 0.0;
}
}  // namespace

void init_local(const Tensor& local, const Shape& global, const LocalPiece& piece,
                const InitSpec& spec, uint64_t seed, const std::string& name) {
  MT_CHECK(local.device().is_cpu(), "init_local fills host tensors");
  MT_CHECK(piece.dim == 0 || piece.dim == 1, "init_local supports pieces along dim 0 or 1");
  MT_CHECK(local.shape().rank() == global.rank(), "local {} vs global {}", local.shape(), global);
  const uint64_t stream = stable_hash(name);
  const int64_t g0 = global.rank() >= 1 ? global[0] : 1;
  const int64_t g1 = global.rank() >= 2 ? global[1] : 1;
  const int64_t inner = global.rank() >= 2 ? global.numel() / (g0 * g1) : 1;
  const Shape& ls = local.shape();
  const int64_t l0 = ls.rank() >= 1 ? ls[0] : 1;
  const int64_t l1 = ls.rank() >= 2 ? ls[1] : 1;
  for (int d = 2; d < global.rank(); ++d)
    MT_CHECK(ls[d] == global[d], "local piece differs from global beyond dim 1");
  if (piece.dim == 0) MT_CHECK(l1 == g1, "a dim-0 piece keeps dim 1 whole");
  if (piece.dim == 1) MT_CHECK(l0 == g0, "a dim-1 piece keeps dim 0 whole");

  auto run = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    for (int64_t i0 = 0; i0 < l0; ++i0)
      for (int64_t i1 = 0; i1 < l1; ++i1) {
        int64_t gi0 = piece.dim == 0 ? piece.begin + i0 : i0;
        int64_t gi1 = piece.dim == 1 ? piece.begin + i1 : i1;
        T* dst = out + (i0 * l1 + i1) * inner;
        bool pad = gi0 >= g0 || gi1 >= g1;
        for (int64_t k = 0; k < inner; ++k) {
          uint64_t flat = uint64_t((gi0 * g1 + gi1) * inner + k);
          dst[k] = pad ? T(0) : T(value_at(spec, seed, stream, flat));
        }
      }
  };
  if (local.dtype() == DType::kF32)
    run(static_cast<float*>(local.raw()));
  else if (local.dtype() == DType::kF64)
    run(static_cast<double*>(local.raw()));
  else
    MT_THROW(ValueError, "init_local: master weights must be float32 or float64, found {}",
             local.dtype());
}

}  // namespace meshtrain
