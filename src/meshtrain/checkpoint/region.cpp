// Boxes, the real (unpadded) region of a shard, and the run plan of a box copy.
#include "meshtrain/checkpoint/region.h"

#include <algorithm>

namespace meshtrain {

int64_t Box::volume() const {
  int64_t v = 1;
  for (int64_t e : ext) v *= e;
  return v;
}

std::string Box::to_string() const {
  std::string s = "[";
  for (size_t d = 0; d < lo.size(); ++d)
    s += fmt::format("{}{}:{}", d ? ", " : "", lo[d], lo[d] + ext[d]);
  return s + "]";
}

Box intersect(const Box& a, const Box& b) {
  MT_CHECK(a.lo.size() == b.lo.size(), "intersect: rank {} vs {}", a.lo.size(), b.lo.size());
  Box r;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    const int64_t lo = std::max(a.lo[d], b.lo[d]);
    const int64_t hi = std::min(a.lo[d] + a.ext[d], b.lo[d] + b.ext[d]);
    r.lo.push_back(lo);
    r.ext.push_back(std::max<int64_t>(0, hi - lo));
  }
  return r;
}

Box real_region(const ParamInfo& p) {
  Box b;
  const int rank = p.global_shape.rank();
  for (int d = 0; d < rank; ++d) {
    const int64_t lo = p.piece.at(d);
    const int64_t hi = std::min(lo + p.local_shape[d], p.piece.limit_at(d, p.global_shape[d]));
    b.lo.push_back(std::min(lo, p.global_shape[d]));
    b.ext.push_back(std::max<int64_t>(0, hi - lo));
  }
  return b;
}

Box shard_box(const ParamInfo& p) {
  Box b;
  for (int d = 0; d < p.global_shape.rank(); ++d) {
    b.lo.push_back(p.piece.at(d));
    b.ext.push_back(p.local_shape[d]);
  }
  return b;
}

RunPlan plan_runs(const Box& region, const Box& a_box, const std::vector<int64_t>& b_shape,
                  const Box& b_box) {
  const int rank = int(region.lo.size());
  MT_CHECK(
      int(a_box.lo.size()) == rank && int(b_box.lo.size()) == rank && int(b_shape.size()) == rank,
      "box copy: ranks differ ({}, {}, {}, {})", rank, a_box.lo.size(), b_box.lo.size(),
      b_shape.size());
  RunPlan rp;
  rp.a_stride.assign(size_t(rank), 1);
  rp.b_stride.assign(size_t(rank), 1);
  for (int d = rank - 2; d >= 0; --d) {
    rp.a_stride[size_t(d)] = rp.a_stride[size_t(d) + 1] * a_box.ext[size_t(d) + 1];
    rp.b_stride[size_t(d)] = rp.b_stride[size_t(d) + 1] * b_shape[size_t(d) + 1];
  }
  for (int d = 0; d < rank; ++d) {
    const size_t u = size_t(d);
    MT_CHECK(
        region.lo[u] >= a_box.lo[u] && region.lo[u] + region.ext[u] <= a_box.lo[u] + a_box.ext[u] &&
            region.lo[u] >= b_box.lo[u] && region.lo[u] + region.ext[u] <= b_box.lo[u] + b_shape[u],
        "box copy: region {} is not inside {} and {} (shape {})", region.to_string(),
        a_box.to_string(), b_box.to_string(), fmt::join(b_shape, "x"));
    rp.a_base += (region.lo[u] - a_box.lo[u]) * rp.a_stride[u];
    rp.b_base += (region.lo[u] - b_box.lo[u]) * rp.b_stride[u];
  }
  rp.outer = rank;
  for (int d = rank - 1; d >= 0; --d) {
    const size_t u = size_t(d);
    rp.outer = d;
    rp.run *= region.ext[u];
    if (region.ext[u] != a_box.ext[u] || region.ext[u] != b_shape[u]) break;
  }
  return rp;
}

}  // namespace meshtrain
