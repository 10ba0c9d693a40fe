// GroupLayout: the sizes of the named mesh groups and this rank's index in each — all that
// placement decisions need. A DeviceMesh provides it with live communicators; `meshtrain plan`
// provides it for any rank of a layout without launching processes.
#pragma once

#include <string>

namespace meshtrain {

class GroupLayout {
 public:
  virtual ~GroupLayout() = default;
  virtual int group_size(const std::string& group) const = 0;
  virtual int group_rank(const std::string& group) const = 0;
};

}  // namespace meshtrain
