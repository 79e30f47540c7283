// Host memory the CPU streams weights from every token (hybrid execution's packed layers, the CPU
// probe): 2 MiB aligned and advised for transparent huge pages. A one-token product reads hundreds
// of MB per layer; with 4 KiB pages every 4 KiB costs a TLB walk, and in a virtual machine (the
// GPU benchmark machine is one) each walk is two-dimensional. SLUICE_THP=0 leaves the pages as the
// kernel gives them (A/B measurements).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/status.h"

namespace sluice::stream {

struct FreeHost {
  void operator()(uint8_t* p) const { std::free(p); }
};
using HostBlock = std::unique_ptr<uint8_t, FreeHost>;

// `bytes` (> 0) of host memory, 2 MiB aligned. Error: out of memory, naming `what`.
Result<HostBlock> alloc_host_block(size_t bytes, const char* what);

}  // namespace sluice::stream
