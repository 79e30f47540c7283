// sluice inspect MODEL.gguf [--json]: architecture, hyper-parameters, tokenizer, tensor table and
// per-layer byte summary; for a split model (first shard given) every shard's header and which
// shard holds each tensor. Reads only the headers; a bad file is reported and exits 2.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.h"
#include "app/inspect.h"

namespace sluice::app {

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"Describe a GGUF file: metadata, tensors, bytes per layer", "sluice inspect"};
  std::string path;
  bool json = false;
  app.add_option("model", path, "GGUF file (the first shard of a split model)")->required();
  app.add_flag("--json", json, "machine-readable output");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  auto file = gguf::File::open(path);
  if (!file.is_ok()) {
    std::fprintf(stderr, "sluice inspect: %s\n", file.status().message().c_str());
    return kExitBadInput;
  }
  const InspectReport report = make_report(*file);
  if (json) {
    std::printf("%s\n", render_json(report).dump(1).c_str());
  } else {
    std::fputs(render_text(report).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace sluice::app
