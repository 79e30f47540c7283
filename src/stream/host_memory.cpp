#include "stream/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

namespace sluice::stream {

Result<HostBlock> alloc_host_block(size_t bytes, const char* what) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (!p) return out_of_memory(std::string("cannot allocate ") + std::to_string(bytes) + " bytes for " + what);
  const char* env = std::getenv("SLUICE_THP");
  if (!(env && std::string_view(env) == "0")) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice: may be refused
  return HostBlock(static_cast<uint8_t*>(p));
}

}  // namespace sluice::stream
