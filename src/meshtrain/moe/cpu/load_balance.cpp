// CPU kernels of the load-balancing ops. The bias update reduces in float64 and in index order,
// so every rank that holds the same counts computes the same bias bit for bit.
#include <algorithm>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
void token_counts(const int32_t* ids, int64_t n, int64_t e, T* out) {
  std::fill_n(out, e, T(0));
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK_T(ValueError, ids[i] >= 0 && ids[i] < e,
               "moe_token_counts: expert id {} at choice {} is outside [0, {})", ids[i], i, e);
    out[ids[i]] += T(1);
  }
}

template <typename T>
void bias_update(T* bias, T* counter, T* load, const T* counts, int64_t e, double coeff) {
  double mean = 0;
  for (int64_t i = 0; i < e; ++i) mean += double(counts[i]);
  mean /= double(e);
  if (coeff > 0) {
    // delta_i = coeff · sign(mean − c_i), then minus mean(delta); sign(0) = 0 as torch.sign.
    double delta_mean = 0;
    for (int64_t i = 0; i < e; ++i) {
      const double diff = mean - double(counts[i]);
      delta_mean += coeff * double((diff > 0) - (diff < 0));
    }
    delta_mean /= double(e);
    for (int64_t i = 0; i < e; ++i) {
      const double diff = mean - double(counts[i]);
      bias[i] = T(double(bias[i]) + coeff * double((diff > 0) - (diff < 0)) - delta_mean);
    }
  }
  std::copy_n(counts, e, load);
  std::fill_n(counter, e, T(0));
}

MT_REGISTER_OPS {
  add_cpu_kernel("moe_token_counts", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "moe_token_counts", [&] {
      token_counts(in_ptr<int32_t>(c, 0), c.in[0].numel(), c.out[0].numel(),
                   out_ptr<scalar_t>(c, 0));
    });
  });
  add_cpu_kernel("expert_bias_update", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "expert_bias_update", [&] {
      scalar_t* counter = inout_ptr<scalar_t>(c, 1);
      const scalar_t* counts = c.in.size() == 4 ? in_ptr<scalar_t>(c, 3) : counter;
      bias_update(inout_ptr<scalar_t>(c, 0), counter, inout_ptr<scalar_t>(c, 2), counts,
                  c.in[0].numel(), c.attrs().f("coeff"));
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
