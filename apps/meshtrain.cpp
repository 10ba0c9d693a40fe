// meshtrain command line: `train` and `plan` subcommands (thin; the work is in train/).
#include <cstdio>
#include <exception>

#include "meshtrain/core/check.h"

int main(int argc, char** argv) {
  try {
    std::printf("meshtrain: not yet wired\n");
    return 0;
  } catch (const meshtrain::Error& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 1;
  }
}
