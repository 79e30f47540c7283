// Holds GPU memory so that only FREE_GIB stay free, then sleeps until killed: engines that size
// themselves from free memory (llama.cpp) see the same budget as sluice's --vram-budget.
//   vram_hold FREE_GIB [DEVICE]   prints "vram_hold: holding X GiB, free Y GiB" once ready
// Build: nvcc -O2 -o vram_hold tools/gpu/vram_hold.cu
#include <cuda_runtime.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vram_hold FREE_GIB [DEVICE]\n");
    return 2;
  }
  const double want_free = std::atof(argv[1]) * double(1ull << 30);
  const int dev = argc > 2 ? std::atoi(argv[2]) : 0;
  if (cudaSetDevice(dev) != cudaSuccess) {
    std::fprintf(stderr, "vram_hold: no CUDA device %d\n", dev);
    return 1;
  }
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 1;
  std::vector<void*> held;
  size_t holding = 0;
  // Allocate in 256 MiB pieces, then smaller ones, until free memory is just above the target.
  for (size_t piece = size_t(256) << 20; piece >= (size_t(1) << 20); piece /= 4) {
    while (cudaMemGetInfo(&free, &total) == cudaSuccess && double(free) - double(piece) >= want_free) {
      void* p = nullptr;
      if (cudaMalloc(&p, piece) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      held.push_back(p);
      holding += piece;
    }
  }
  cudaMemGetInfo(&free, &total);
  std::printf("vram_hold: holding %.2f GiB, free %.2f GiB of %.2f GiB\n", double(holding) / (1ull << 30),
              double(free) / (1ull << 30), double(total) / (1ull << 30));
  std::fflush(stdout);
  std::signal(SIGTERM, [](int) { std::_Exit(0); });
  for (;;) pause();
}
