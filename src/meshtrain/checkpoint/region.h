// Regions of a global tensor and the copies between them: a rank's shard is a box of the global
// tensor (padding cut off), a stored slice is a box, and resharding is box intersection plus a
// copy of contiguous runs. Rule: runs are as long as the layouts allow (whole trailing dims merge),
// so a dim-0 shard is one run and a dim-1 expert shard one run per expert.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/parallel/plan.h"

namespace meshtrain {

struct Box {
  std::vector<int64_t> lo, ext;  // per dim: first global index and extent
  int64_t volume() const;
  bool empty() const { return volume() == 0; }
  std::string to_string() const;  // "[0:4, 8:16]"
};

// The intersection of two boxes of one tensor (extent 0 where they miss).
Box intersect(const Box& a, const Box& b);

// The part of the global tensor this rank's master of `p` holds, without padding (empty when the
// shard is all padding, as the last shard of an uneven split can be). For a whole tensor: all of
// it.
Box real_region(const ParamInfo& p);
// Where the local (padded) shard's element 0 sits in the global tensor, with the shard's storage
// extents: the block a shard's host buffer is, for for_each_run.
Box shard_box(const ParamInfo& p);

// For every maximal contiguous run of `region` (global coordinates) inside two row-major blocks,
// calls f(a_element_offset, b_element_offset, elements). Block a holds the global box a_box, block
// b the global box b_box (its storage shape may be larger than b_box.ext: `b_shape`, e.g. a padded
// shard whose real part starts at b_box.lo); region must lie inside both.
template <typename F>
void for_each_run(const Box& region, const Box& a_box, const std::vector<int64_t>& b_shape,
                  const Box& b_box, F&& f);

// Implementation detail of for_each_run, exposed for its template.
struct RunPlan {
  int outer = 0;                            // dims [0, outer) are iterated; the rest form one run
  int64_t run = 1;                          // elements per run
  std::vector<int64_t> a_stride, b_stride;  // row-major element strides of the two blocks
  int64_t a_base = 0, b_base = 0;           // element offset of region.lo in each block
};
RunPlan plan_runs(const Box& region, const Box& a_box, const std::vector<int64_t>& b_shape,
                  const Box& b_box);

template <typename F>
void for_each_run(const Box& region, const Box& a_box, const std::vector<int64_t>& b_shape,
                  const Box& b_box, F&& f) {
  if (region.empty()) return;
  const RunPlan rp = plan_runs(region, a_box, b_shape, b_box);
  std::vector<int64_t> idx(size_t(rp.outer), 0);
  for (;;) {
    int64_t a = rp.a_base, b = rp.b_base;
    for (int d = 0; d < rp.outer; ++d) a += idx[size_t(d)] * rp.a_stride[size_t(d)];
    for (int d = 0; d < rp.outer; ++d) b += idx[size_t(d)] * rp.b_stride[size_t(d)];
    f(a, b, rp.run);
    int d = rp.outer - 1;
    for (; d >= 0; --d) {
      if (++idx[size_t(d)] < region.ext[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace meshtrain
