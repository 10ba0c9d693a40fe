// Placements (DTensor's vocabulary): how a tensor relates to its global value along one mesh
// group. Shard(d): each rank holds block `rank` of dim d (dim 0 here; padded to equal blocks);
// Replicate: every rank holds all of it; Partial: every rank holds a summand. `redistribute`
// emits the differentiable collective that moves a value from one placement to another, so
// autodiff derives the reverse move (all_gather ↔ reduce_scatter, all_reduce).
#pragma once

#include <string>

#include "meshtrain/ir/builder.h"

namespace meshtrain {

struct Placement {
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // kShard only

  static Placement replicate() { return {}; }
  static Placement shard(int dim) { return {Kind::kShard, dim}; }
  static Placement partial() { return {Kind::kPartial, 0}; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool operator==(const Placement&) const = default;
  std::string to_string() const;  // "Shard(0)", "Replicate()", "Partial(sum)"
};

// x (local value, placement `from` over `group`) -> the same global value with placement `to`.
// Supported moves: Shard(0) -> Replicate (all_gather), Partial -> Replicate (all_reduce),
// Partial -> Shard(0) (reduce_scatter); equal placements return x. Others throw.
ValueId redistribute(Builder& b, ValueId x, Placement from, Placement to, MeshGroup group,
                     int group_size);

}  // namespace meshtrain
