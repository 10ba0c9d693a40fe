// Parity harness helpers; compare_params walks each rank's block against the broadcast tensor.
#include "parity_util.h"

#include <cmath>

namespace meshtrain::testing {

JobConfig harness_job(int steps, const std::vector<std::vector<std::string>>& overrides) {
  return tiny_job_config(
      {.steps = steps, .seed = 3, .warmup_steps = 3, .dump_folder = "/tmp/meshtrain_parity"},
      overrides);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

namespace {
// The load balancing's routing counters: token counts per expert, not weights.
bool is_routing_counter(const std::string& name) {
  for (const std::string end : {".tokens_per_expert", ".tokens_per_expert_last_step"})
    if (name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0)
      return true;
  return false;
}
}  // namespace

ParamDiff compare_params(const Trainer& got, const Trainer* ref, Communicator& comm,
                         Backend& host) {
  ParamDiff out;
  for (const ParamInfo& p : got.plan().params()) {
    Tensor full = Tensor::empty(p.global_shape, p.dtype);
    if (comm.rank() == 0) full.copy_from_host(ref->params().master_to_host(p.name));
    comm.broadcast(full, 0, host.stream(0));
    Tensor mine = got.params().master_to_host(p.name);
    // A routing counter's difference is the share of the layer's routed tokens that went to
    // another expert: |x - ref| / max(1, Σ ref), kept apart from the weights' figure (the
    // caller decides how to judge it; see check_layout).
    const bool counter = is_routing_counter(p.name);
    double scale_of_counts = 0;
    if (counter) {
      for (int64_t i = 0; i < full.numel(); ++i)
        scale_of_counts += std::abs(full.item_as_double(i));
      scale_of_counts = std::max(1.0, scale_of_counts);
    }
    // Walk the local block; each element maps to global index piece.begin + local index.
    const Shape& ls = p.local_shape;
    const int rk = ls.rank();
    std::vector<int64_t> idx(size_t(rk), 0);
    for (int64_t i = 0; i < mine.numel(); ++i) {
      std::vector<int64_t> gidx(static_cast<size_t>(rk));
      int64_t flat = 0;
      for (int d = 0; d < rk; ++d) {
        gidx[size_t(d)] = p.piece.at(d) + idx[size_t(d)];
        flat = flat * p.global_shape[d] + gidx[size_t(d)];
      }
      const bool pad = p.piece.is_padding(gidx, p.global_shape);
      double x = mine.item_as_double(i);
      double want = pad ? 0.0 : full.item_as_double(flat);
      double diff = pad                   ? (x == 0.0 ? 0.0 : 1.0)
                    : scale_of_counts > 0 ? std::abs(x - want) / scale_of_counts
                                          : std::abs(x - want) / (1.0 + std::abs(want));
      double& worst = counter ? out.routing : out.worst;
      if (diff > worst) {
        worst = diff;
        (counter ? out.routing_where : out.where) =
            fmt::format("{}[flat {}]", p.name, pad ? -1 : flat);
      }
      for (int d = rk - 1; d >= 0; --d) {
        if (++idx[size_t(d)] < ls[d]) break;
        idx[size_t(d)] = 0;
      }
    }
  }
  return out;
}

}  // namespace meshtrain::testing
