// Test tool: writes a GGUF model as llama.cpp's gguf-split shards (tests/gguf_split_util.h), so
// the shell tests can split a model without a llama.cpp build.
// usage: test_gguf_split --split-max-tensors N IN.gguf OUT_PREFIX   (as llama-gguf-split's flags)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gguf/gguf.h"
#include "gguf_split_util.h"

int main(int argc, char** argv) {
  if (argc != 5 || std::strcmp(argv[1], "--split-max-tensors") != 0 || std::atoi(argv[2]) <= 0) {
    std::fprintf(stderr, "usage: %s --split-max-tensors N IN.gguf OUT_PREFIX\n", argv[0]);
    return 2;
  }
  auto in = sluice::gguf::File::open(argv[3]);
  if (!in.is_ok()) {
    std::fprintf(stderr, "%s\n", in.status().message().c_str());
    return 2;
  }
  auto paths = sluice::test::write_gguf_split(*in, argv[4], size_t(std::atoi(argv[2])));
  if (!paths.is_ok()) {
    std::fprintf(stderr, "%s\n", paths.status().message().c_str());
    return 1;
  }
  for (const auto& p : *paths) std::printf("%s\n", p.c_str());
  return 0;
}
