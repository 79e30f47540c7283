// synth: weight generation and the streaming write. Quantizing tens of GB of random floats
// would take far longer than writing them, so each (format, scale) class gets a pool of ~2M
// quantized random elements once, and tensors are filled by copying runs of pool blocks from
// pseudo-random offsets: every block is a valid block of the format with finite scales, and the
// cost per byte is a memcpy. Runs are keyed by (seed, tensor, run index), so the output does not
// depend on the thread count or chunking.
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "app/synth.h"

namespace sluice::app {

namespace {

constexpr uint64_t kMaxPoolElems = 1ull << 21;
// Pool elements per work item, a multiple of every block and > kRunBlocks blocks of 256.
constexpr uint64_t kPiece = 1ull << 14;
constexpr uint64_t kRunBlocks = 16;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1) from a hash.
float unit(uint64_t h) { return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0); }

// Runs fn(begin, end) over [0, n) split across `threads` threads.
template <typename Fn>
void parallel_for(uint64_t n, unsigned threads, Fn fn) {
  const uint64_t t = std::max<uint64_t>(1, std::min<uint64_t>(threads, n));
  if (t == 1) {
    fn(uint64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  for (uint64_t i = 0; i < t; ++i) pool.emplace_back([&, i] { fn(n * i / t, n * (i + 1) / t); });
  for (auto& th : pool) th.join();
}

struct Pool {
  quant::Type type;
  uint64_t block_bytes = 0;
  uint64_t n_blocks = 0;
  std::vector<uint8_t> bytes;
};

// Gaussian-ish values (sum of 4 uniforms, std `scale`) quantized to `type`.
// `elems` is a multiple of kPiece.
Pool make_pool(quant::Type type, float scale, uint64_t elems, uint64_t seed, unsigned threads) {
  const auto& tt = quant::traits(type);
  Pool p;
  p.type = type;
  p.block_bytes = static_cast<uint64_t>(tt.block_bytes);
  p.n_blocks = elems / static_cast<uint64_t>(tt.block_elems);
  p.bytes.resize(p.n_blocks * p.block_bytes);
  // The scalar reference quantizer: the same seed must give the same bytes on every CPU (golden
  // fixtures are made from synth files and checked by sha256).
  const auto quantize = quant::kernels_for(type, quant::Isa::kRef)->quantize_row;
  const uint64_t pieces = elems / kPiece;
  parallel_for(pieces, threads, [&](uint64_t begin, uint64_t end) {
    std::vector<float> buf(kPiece);
    for (uint64_t piece = begin; piece < end; ++piece) {
      uint64_t h = splitmix(seed ^ (piece * 0xD1B54A32D192ED03ull));
      for (uint64_t i = 0; i < kPiece; ++i) {
        // Sum of four uniforms in [-1,1) has variance 4/3; normalize to std `scale`.
        float s = 0;
        for (int k = 0; k < 4; ++k) s += unit(h = splitmix(h));
        buf[i] = s * 0.8660254f * scale;
      }
      const uint64_t first_block = piece * kPiece / static_cast<uint64_t>(tt.block_elems);
      quantize(buf.data(), p.bytes.data() + first_block * p.block_bytes, static_cast<int64_t>(kPiece));
    }
  });
  return p;
}

// llama-3.1 rope scaling factors (factor 8, low/high frequency factors 1 and 4, original
// context 8192): llama.cpp divides each rotary frequency by these.
float rope_factor(uint64_t i, uint32_t head_dim, float theta) {
  constexpr double kFactor = 8, kLow = 1, kHigh = 4, kOrigCtx = 8192;
  const double pi = 3.14159265358979323846;
  const double freq = 1.0 / std::pow(static_cast<double>(theta), 2.0 * static_cast<double>(i) / head_dim);
  const double wavelen = 2 * pi / freq;
  if (wavelen < kOrigCtx / kHigh) return 1.0f;
  if (wavelen > kOrigCtx / kLow) return static_cast<float>(kFactor);
  const double smooth = (kOrigCtx / wavelen - kLow) / (kHigh - kLow);
  return static_cast<float>(1.0 / ((1 - smooth) / kFactor + smooth));
}

}  // namespace

Status write_synth(const SynthPlan& plan, const std::string& path, uint64_t seed, unsigned threads,
                   SynthStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  gguf::Writer w;
  for (const auto& kv : plan.metadata) w.add(kv.key, kv.value);
  for (const auto& t : plan.tensors) SLUICE_RETURN_IF_ERROR(w.add_tensor(t.name, t.type, t.shape));

  // One pool per (format, scale) class of matrix tensors, no larger than the class needs.
  std::map<std::pair<quant::Type, float>, uint64_t> class_elems;
  for (const auto& t : plan.tensors) {
    if (t.kind != TensorKind::kMatrix) continue;
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    auto& e = class_elems[{t.type, t.scale}];
    e = std::min(kMaxPoolElems, e + n);
  }
  std::map<std::pair<quant::Type, float>, Pool> pools;
  for (const auto& [key, elems] : class_elems) {
    const uint64_t rounded = (elems + kPiece - 1) / kPiece * kPiece;
    pools.emplace(key, make_pool(key.first, key.second, rounded, splitmix(seed ^ pools.size()), threads));
  }
  // head_dim for rope_freqs = 2 * its length; theta from metadata.
  float theta = 10000.0f;
  for (const auto& kv : plan.metadata) {
    if (kv.key.size() > 15 && kv.key.compare(kv.key.size() - 15, 15, ".rope.freq_base") == 0) {
      theta = static_cast<float>(kv.value.f);
    }
  }

  Status st = w.write(path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) -> Status {
    const SynthTensor& t = plan.tensors[index];
    const uint64_t tensor_salt = splitmix(seed ^ (index * 0x9E3779B97F4A7C15ull) ^ 0x5EED);
    if (t.kind == TensorKind::kMatrix) {
      const Pool& pool = pools.at({t.type, t.scale});
      const uint64_t bb = pool.block_bytes;
      const uint64_t first = offset / bb, count = nbytes / bb;  // chunks are whole rows, so whole blocks
      const uint64_t first_run = first / kRunBlocks, end_run = (first + count + kRunBlocks - 1) / kRunBlocks;
      parallel_for(end_run - first_run, threads, [&](uint64_t begin, uint64_t end) {
        for (uint64_t r = first_run + begin; r < first_run + end; ++r) {
          const uint64_t lo = std::max(r * kRunBlocks, first), hi = std::min((r + 1) * kRunBlocks, first + count);
          const uint64_t src = splitmix(tensor_salt ^ r) % (pool.n_blocks - kRunBlocks) + (lo - r * kRunBlocks);
          std::memcpy(dst + (lo - first) * bb, pool.bytes.data() + src * bb, (hi - lo) * bb);
        }
      });
      return Status::ok();
    }
    // Small F32 vectors: computed directly.
    auto* out = reinterpret_cast<float*>(dst);
    const uint64_t first = offset / 4, n = nbytes / 4;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t e = first + i;
      float v = 0;
      switch (t.kind) {
        case TensorKind::kNorm: v = 1.0f + t.scale * unit(splitmix(tensor_salt ^ e)); break;
        case TensorKind::kBias: v = t.scale * unit(splitmix(tensor_salt ^ e)); break;
        case TensorKind::kRopeFreqs: v = rope_factor(e, static_cast<uint32_t>(t.shape[0] * 2), theta); break;
        case TensorKind::kMatrix: break;
      }
      std::memcpy(out + i, &v, sizeof v);
    }
    return Status::ok();
  });
  SLUICE_RETURN_IF_ERROR(st);
  if (stats) {
    stats->bytes = w.file_bytes();
    stats->tensors = plan.tensors.size();
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return Status::ok();
}

}  // namespace sluice::app
