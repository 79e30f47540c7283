#include <cstdio>

#include "app/commands.h"

namespace sluice::app {

// Placeholder until the command lands.
int cmd_inspect(int, char**) {
  std::fprintf(stderr, "sluice inspect: not available in this build\n");
  return kExitFailure;
}

}  // namespace sluice::app
