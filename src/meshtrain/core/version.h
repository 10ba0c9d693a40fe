// The build's identity for `meshtrain --version`: the project version and the git commit the
// build was configured from ("unknown" when configured outside a git checkout).
#pragma once

namespace meshtrain {

const char* meshtrain_version();     // "0.1.0"
const char* meshtrain_git_commit();  // "7e533f7" or "unknown"

}  // namespace meshtrain
