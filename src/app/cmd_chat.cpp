#include <cstdio>

#include "app/commands.h"

namespace sluice::app {

// Placeholder until the command lands.
int cmd_chat(int, char**) {
  std::fprintf(stderr, "sluice chat: not available in this build\n");
  return kExitFailure;
}

}  // namespace sluice::app
