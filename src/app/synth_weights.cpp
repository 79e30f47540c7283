// synth: weight generation and the streaming write. Quantizing tens of GB of random floats
// would take far longer than writing them, so each (format, scale) class gets a pool of ~2M
// quantized random elements once, and tensors are filled by copying runs of pool blocks from
// pseudo-random offsets: every block is a valid block of the format with finite scales, and the
// cost per byte is a memcpy. Runs are keyed by (seed, tensor, run index), so the output does not
// depend on the thread count or chunking.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
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

// Gaussian-ish (sum of four uniforms), std 1.
float gauss(uint64_t h) {
  float s = 0;
  for (int k = 0; k < 4; ++k) s += unit(h = splitmix(h));
  return s * 0.8660254f;
}

// ---- route skew (RouteSkew in synth.h) ---------------------------------------------------------

// token_embd's reserved dims: dim 0 holds kRouteConst x the embedding's std in every row (the
// carrier of the per-expert bias), dims 1.. the token's code (std as the other entries).
constexpr float kRouteConst = 2.0f;
// Tokens the biases are calibrated on (spread over the vocabulary: enough that the rarest of 128
// experts at S = 1.5 still gets ~50 selections), and fitting iterations (40 at steps 0.5 then
// 0.25 reach the sampling noise of 4096 tokens in a numpy model of this fit; step 1 oscillates).
constexpr uint32_t kCalibTokens = 4096;
constexpr int kCalibIters = 40;

struct RouteCodes {
  uint64_t span = 0;        // leading elements of each token_embd row that are re-quantized
  uint64_t span_bytes = 0;  // their bytes (a whole number of blocks)
  std::vector<uint8_t> bytes;  // vocab x span_bytes
  std::vector<float> code;     // dequantized reserved dims, vocab x dims (what the model reads)
};

// Each row's leading span (the reserved dims rounded up to a whole block) is generated and
// quantized here instead of coming from the pool, so its reserved dims are known exactly.
RouteCodes make_route_codes(const SynthTensor& embd, uint32_t dims, uint64_t seed, unsigned threads) {
  const auto& tt = quant::traits(embd.type);
  const auto* k = quant::kernels_for(embd.type, quant::Isa::kRef);  // same bytes on every CPU
  const uint64_t ne0 = embd.shape[0], vocab = embd.shape[1], be = uint64_t(tt.block_elems);
  RouteCodes rc;
  rc.span = std::min(ne0, (dims + be - 1) / be * be);
  rc.span_bytes = uint64_t(quant::row_bytes(embd.type, int64_t(rc.span)));
  rc.bytes.resize(vocab * rc.span_bytes);
  rc.code.resize(vocab * dims);
  parallel_for(vocab, threads, [&](uint64_t begin, uint64_t end) {
    std::vector<float> f(rc.span), back(rc.span);
    for (uint64_t t = begin; t < end; ++t) {
      const uint64_t h = splitmix(seed ^ 0xC0DEull ^ (t * 0x9E3779B97F4A7C15ull));
      for (uint64_t j = 0; j < rc.span; ++j) f[j] = embd.scale * gauss(splitmix(h ^ (j + 1)));
      f[0] = kRouteConst * embd.scale;
      k->quantize_row(f.data(), rc.bytes.data() + t * rc.span_bytes, int64_t(rc.span));
      k->dequantize_row(rc.bytes.data() + t * rc.span_bytes, back.data(), int64_t(rc.span));
      std::copy(back.begin(), back.begin() + dims, rc.code.begin() + int64_t(t * dims));
    }
  });
  return rc;
}

// One layer's router restricted to the reserved dims: experts x dims, row e = [bias_e / carrier,
// code weights]. The code weights are random with std 1 / (embedding std x sqrt(dims - 1)), so the
// code part of a logit has std ~1 over tokens; the biases are fitted so that the top-k selections
// of the calibration tokens follow the targets, in log space (a bias moves its expert's share
// about exponentially; damped so the rare tail, where the slope is steep, does not overshoot).
std::vector<float> calibrate_router(const RouteSkew& rs, const RouteCodes& rc, float embd_scale, uint64_t vocab,
                                    uint64_t layer_seed) {
  const uint32_t E = rs.experts, K = rs.experts_used, D = rs.dims;
  // Which expert has which popularity rank in this layer.
  std::vector<uint32_t> perm(E);
  std::iota(perm.begin(), perm.end(), 0u);
  uint64_t h = layer_seed;
  for (uint32_t i = E - 1; i > 0; --i) std::swap(perm[i], perm[(h = splitmix(h)) % (i + 1)]);
  const std::vector<double> share = route_targets(E, K, rs.exponent);

  std::vector<float> w(uint64_t{E} * D);
  const float code_w = 1.0f / (embd_scale * std::sqrt(float(D - 1)));
  for (uint32_t e = 0; e < E; ++e) {
    for (uint32_t j = 1; j < D; ++j) w[uint64_t{e} * D + j] = code_w * gauss(splitmix(layer_seed ^ (uint64_t{e} * D + j)));
  }
  const uint64_t T = std::min<uint64_t>(vocab, kCalibTokens);
  const float carrier = kRouteConst * embd_scale;
  std::vector<float> noise(T * E), a(T);
  for (uint64_t i = 0; i < T; ++i) {
    const float* c = rc.code.data() + (i * vocab / T) * D;
    a[i] = c[0] / carrier;  // ~1; quantization moves it a little per token
    for (uint32_t e = 0; e < E; ++e) {
      float n = 0;
      for (uint32_t j = 1; j < D; ++j) n += w[uint64_t{e} * D + j] * c[j];
      noise[i * E + e] = n;
    }
  }
  std::vector<double> want(E), bias(E);
  for (uint32_t r = 0; r < E; ++r) {
    want[perm[r]] = share[r] * double(T) * K;
    bias[perm[r]] = std::log(share[r] * E);
  }
  std::vector<uint32_t> count(E);
  std::vector<float> logit(E), sorted(E);
  for (int it = 0; it < kCalibIters; ++it) {
    std::fill(count.begin(), count.end(), 0u);
    for (uint64_t i = 0; i < T; ++i) {
      for (uint32_t e = 0; e < E; ++e) logit[e] = float(bias[e]) * a[i] + noise[i * E + e];
      sorted = logit;
      std::nth_element(sorted.begin(), sorted.begin() + (K - 1), sorted.end(), std::greater<float>());
      const float kth = sorted[K - 1];
      for (uint32_t e = 0; e < E; ++e) count[e] += logit[e] >= kth;
    }
    const double step = it < kCalibIters / 2 ? 0.5 : 0.25;
    for (uint32_t e = 0; e < E; ++e) {
      bias[e] += step * std::clamp(std::log((want[e] + 0.5) / (count[e] + 0.5)), -2.0, 2.0);
    }
  }
  for (uint32_t e = 0; e < E; ++e) w[uint64_t{e} * D] = float(bias[e]) / carrier;
  return w;
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
                   SynthStats* stats, const core::ProgressFn& on_progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  gguf::Writer w;
  for (const auto& kv : plan.metadata) w.add(kv.key, kv.value);
  for (const auto& t : plan.tensors) SLUICE_RETURN_IF_ERROR(w.add_tensor(t.name, t.type, t.shape));

  // Route skew: the token codes and every layer's router (RouteSkew).
  const RouteSkew& rs = plan.skew;
  RouteCodes codes;
  std::map<int, std::vector<float>> routers;  // layer -> experts x dims
  if (rs.exponent > 0) {
    const SynthTensor* embd = nullptr;
    std::vector<int> layers;
    for (const auto& t : plan.tensors) {
      if (t.reserved == Reserved::kEmbedRows) embd = &t;
      if (t.kind == TensorKind::kRouter) layers.push_back(t.layer);
    }
    if (!embd || rs.dims < 2 || rs.experts_used < 1 || rs.experts_used > rs.experts) {
      return invalid_argument("route skew: the plan has no token_embd or a bad expert count");
    }
    codes = make_route_codes(*embd, rs.dims, seed, threads);
    std::vector<std::vector<float>> fitted(layers.size());
    parallel_for(layers.size(), threads, [&](uint64_t begin, uint64_t end) {
      for (uint64_t i = begin; i < end; ++i) {
        fitted[i] = calibrate_router(rs, codes, embd->scale, embd->shape[1],
                                     splitmix(seed ^ 0x5047E7ull ^ (uint64_t(layers[i]) * 0xD1B54A32D192ED03ull)));
      }
    });
    for (size_t i = 0; i < layers.size(); ++i) routers[layers[i]] = std::move(fitted[i]);
  }

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

  auto fill_tensor = [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) -> Status {
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
      if (t.reserved == Reserved::kEmbedRows || t.reserved == Reserved::kZeroRows) {
        const uint64_t rb = uint64_t(quant::row_bytes(t.type, int64_t(t.shape[0])));
        for (uint64_t row = offset / rb; row < (offset + nbytes) / rb; ++row) {
          uint8_t* d = dst + (row * rb - offset);
          if (t.reserved == Reserved::kEmbedRows) {
            std::memcpy(d, codes.bytes.data() + row * codes.span_bytes, codes.span_bytes);
          } else if (row % t.shape[1] < rs.dims) {
            std::memset(d, 0, rb);  // an all-zero block is zero in every format
          }
        }
      }
      return Status::ok();
    }
    // Small F32 vectors: computed directly.
    auto* out = reinterpret_cast<float*>(dst);
    const uint64_t first = offset / 4, n = nbytes / 4;
    const float* router = t.kind == TensorKind::kRouter ? routers.at(t.layer).data() : nullptr;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t e = first + i;
      float v = 0;
      switch (t.kind) {
        case TensorKind::kNorm:
          v = t.reserved == Reserved::kUnitGains && e < rs.dims ? 1.0f : 1.0f + t.scale * unit(splitmix(tensor_salt ^ e));
          break;
        case TensorKind::kRouter: {
          const uint64_t col = e % t.shape[0], expert = e / t.shape[0];
          v = col < rs.dims ? router[expert * rs.dims + col] : 0.0f;
          break;
        }
        case TensorKind::kBias: v = t.scale * unit(splitmix(tensor_salt ^ e)); break;
        case TensorKind::kRopeFreqs: v = rope_factor(e, static_cast<uint32_t>(t.shape[0] * 2), theta); break;
        case TensorKind::kMatrix: break;
      }
      std::memcpy(out + i, &v, sizeof v);
    }
    return Status::ok();
  };
  uint64_t header = 0;
  if (on_progress) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<uint8_t> hb, w.header_bytes());
    header = hb.size();
    on_progress(0, w.file_bytes());
  }
  Status st = w.write(path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) -> Status {
    Status s = fill_tensor(index, offset, dst, nbytes);
    if (s.is_ok() && on_progress) on_progress(header + w.tensors()[index].offset + offset + nbytes, w.file_bytes());
    return s;
  });
  SLUICE_RETURN_IF_ERROR(st);
  if (on_progress) on_progress(w.file_bytes(), w.file_bytes());
  if (stats) {
    stats->bytes = w.file_bytes();
    stats->tensors = plan.tensors.size();
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return Status::ok();
}

}  // namespace sluice::app
