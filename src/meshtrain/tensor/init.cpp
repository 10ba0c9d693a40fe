// init_local: each element's value depends only on (seed, parameter name, global flat index).
#include "meshtrain/tensor/init.h"

#include <exception>
#include <thread>

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
      MT_THROW(ValueError, "trunc_normal bounds [{}, {}] with std {} reject every sample", s.a, s.b,
               s.std);
  }
  return 0.0;
}
}  // namespace

bool LocalPiece::is_padding(const std::vector<int64_t>& g, const Shape& global) const {
  for (int d = 0; d < global.rank(); ++d)
    if (g[size_t(d)] >= limit_at(d, global[d])) return true;
  return false;
}

void init_local(const Tensor& local, const Shape& global, const LocalPiece& piece,
                const InitSpec& spec, uint64_t seed, const std::string& name) {
  MT_CHECK(local.device().is_cpu(), "init_local fills host tensors");
  const Shape& ls = local.shape();
  const int r = global.rank();
  MT_CHECK(ls.rank() == r, "local {} vs global {}", ls, global);
  const uint64_t stream = stable_hash(name);
  // Global strides; the innermost dim is walked as one contiguous run.
  std::vector<int64_t> gstride(size_t(std::max(r, 1)), 1);
  for (int d = r - 2; d >= 0; --d) gstride[size_t(d)] = gstride[size_t(d + 1)] * global[d + 1];
  const int64_t inner_local = r ? ls[r - 1] : 1;
  const int64_t inner_begin = r ? piece.at(r - 1) : 0;
  const int64_t inner_global = r ? piece.limit_at(r - 1, global[r - 1]) : 1;
  const int64_t outer = inner_local ? local.numel() / inner_local : 0;

  // Rows [o_begin, o_end) of the outer odometer; elements are independent, so threads split rows.
  auto run_rows = [&](auto* out, int64_t o_begin, int64_t o_end) {
    using T = std::remove_pointer_t<decltype(out)>;
    std::vector<int64_t> idx(size_t(std::max(r - 1, 0)), 0);
    for (int64_t o = o_begin, d = r - 2; d >= 0; --d) {  // odometer position of row o_begin
      idx[size_t(d)] = o % ls[d];
      o /= ls[d];
    }
    for (int64_t o = o_begin; o < o_end; ++o) {
      bool pad = false;
      int64_t base = 0;
      for (int d = 0; d + 1 < r; ++d) {
        int64_t g = piece.at(d) + idx[size_t(d)];
        pad |= g >= piece.limit_at(d, global[d]);
        base += g * gstride[size_t(d)];
      }
      T* dst = out + o * inner_local;
      for (int64_t k = 0; k < inner_local; ++k) {
        int64_t g = inner_begin + k;
        dst[k] =
            (pad || g >= inner_global) ? T(0) : T(value_at(spec, seed, stream, uint64_t(base + g)));
      }
      for (int d = r - 2; d >= 0; --d) {
        if (++idx[size_t(d)] < ls[d]) break;
        idx[size_t(d)] = 0;
      }
    }
  };
  // Start-up only: a 16B-parameter shard takes minutes on one core, seconds on all of them.
  auto run = [&](auto* out) {
    const int64_t work = local.numel();
    int threads = int(std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                        std::max<int64_t>(1, work / (1 << 20))));
    threads = int(std::min<int64_t>(threads, std::max<int64_t>(outer, 1)));
    if (threads <= 1) return run_rows(out, 0, outer);
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        try {
          run_rows(out, outer * t / threads, outer * (t + 1) / threads);
        } catch (...) {
          errors[size_t(t)] = std::current_exception();
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
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
