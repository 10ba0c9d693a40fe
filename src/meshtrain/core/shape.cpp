// Shape printing.
#include "meshtrain/core/shape.h"

namespace meshtrain {
std::string Shape::to_string() const { return fmt::format("[{}]", fmt::join(dims_, ", ")); }
}  // namespace meshtrain
