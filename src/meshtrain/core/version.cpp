// Version strings, from the header CMake writes at configure time (core/version_info.h.in).
#include "meshtrain/core/version.h"

#include "meshtrain/core/version_info.h"

namespace meshtrain {

const char* meshtrain_version() { return MESHTRAIN_VERSION_STRING; }
const char* meshtrain_git_commit() { return MESHTRAIN_GIT_COMMIT; }

}  // namespace meshtrain
