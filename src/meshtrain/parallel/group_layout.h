// GroupLayout: the sizes of the mesh groups and this rank's index in each — all that
// placement decisions need. A DeviceMesh provides it with live communicators; `meshtrain plan`
// provides it for any rank of a layout without launching processes.
#pragma once

#include "meshtrain/core/mesh_group.h"

namespace meshtrain {

class GroupLayout {
 public:
  virtual ~GroupLayout() = default;
  virtual int group_size(MeshGroup group) const = 0;
  virtual int group_rank(MeshGroup group) const = 0;
};

}  // namespace meshtrain
