// RankGroups: GroupLayout of one rank of a MeshLayout. The trainer uses it with the live mesh's
// layout; `meshtrain plan` uses it for any rank of a layout without launching processes.
#pragma once

#include "meshtrain/parallel/group_layout.h"
#include "meshtrain/parallel/mesh.h"

namespace meshtrain {

class RankGroups final : public GroupLayout {
 public:
  RankGroups(const MeshLayout& layout, int rank) : layout_(layout), rank_(rank) {}
  int group_size(MeshGroup group) const override { return layout_.group_size(group); }
  int group_rank(MeshGroup group) const override { return layout_.group_index(group, rank_); }

 private:
  MeshLayout layout_;
  int rank_;
};

}  // namespace meshtrain
