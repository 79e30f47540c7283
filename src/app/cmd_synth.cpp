#include <cstdio>

#include "app/commands.h"

namespace sluice::app {

// Placeholder until the command lands.
int cmd_synth(int, char**) {
  std::fprintf(stderr, "sluice synth: not available in this build\n");
  return kExitFailure;
}

}  // namespace sluice::app
