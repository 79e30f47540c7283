#include <cstdio>
#include <cstring>
#include <string_view>

#include "app/commands.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

constexpr Command kCommands[] = {
    {"run", sluice::app::cmd_run, "generate text: sluice run -m MODEL -p PROMPT -n N"},
    {"chat", sluice::app::cmd_chat, "interactive chat: sluice chat -m MODEL"},
    {"perplexity", sluice::app::cmd_perplexity, "perplexity: sluice perplexity -m MODEL -f TEXT"},
    {"inspect", sluice::app::cmd_inspect, "describe a GGUF file: sluice inspect MODEL [--json]"},
    {"synth", sluice::app::cmd_synth, "write a random GGUF: sluice synth SHAPE --type T -o FILE"},
    {"bench", sluice::app::cmd_bench, "throughput: sluice bench -m MODEL"},
    {"calibrate", sluice::app::cmd_calibrate, "layer-skip scores: sluice calibrate -m MODEL -f TEXT"},
    {"serve", sluice::app::cmd_serve, "OpenAI-compatible HTTP server: sluice serve -m MODEL [--port 8080]"},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: sluice <command> [options]   (sluice <command> --help for details)\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-11s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return sluice::app::kExitBadInput;
  }
  std::string_view name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    usage(stdout);
    return sluice::app::kExitOk;
  }
  for (const auto& c : kCommands) {
    if (name == c.name) return c.fn(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "sluice: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return sluice::app::kExitBadInput;
}
