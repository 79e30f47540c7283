#include "decode/sampler.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice::decode {
namespace {

// Strict weak order: higher logit first, ties to the lower id (so greedy and truncation are
// deterministic whatever the sort algorithm does with equal keys).
bool more_likely(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Softmax of cands[i].logit / temperature into cands[i].p; cands sorted, so [0] is the max.
void softmax_sorted(std::vector<Candidate>& cands, float temperature) {
  const float max = cands.front().logit;
  if (!std::isfinite(max)) {  // every logit -inf (or +inf at the top): the top one takes all
    for (auto& c : cands) c.p = 0;
    cands.front().p = 1;
    return;
  }
  double sum = 0;
  for (auto& c : cands) {
    c.p = static_cast<float>(std::exp(double(c.logit - max) / temperature));
    sum += c.p;
  }
  for (auto& c : cands) c.p = static_cast<float>(c.p / sum);
}

// The largest value, NaN skipped; -inf when there is none. 16-float blocks: maxps(x, m) keeps m
// where x is NaN.
float max_not_nan(std::span<const float> x) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = x.size();
  const float* p = x.data();
  size_t i = 0;
  float best = kNegInf;
#if defined(__SSE2__)
  __m128 m0 = _mm_set1_ps(kNegInf), m1 = m0, m2 = m0, m3 = m0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm_max_ps(_mm_loadu_ps(p + i), m0);
    m1 = _mm_max_ps(_mm_loadu_ps(p + i + 4), m1);
    m2 = _mm_max_ps(_mm_loadu_ps(p + i + 8), m2);
    m3 = _mm_max_ps(_mm_loadu_ps(p + i + 12), m3);
  }
  alignas(16) float lanes[16];
  _mm_store_ps(lanes, m0);
  _mm_store_ps(lanes + 4, m1);
  _mm_store_ps(lanes + 8, m2);
  _mm_store_ps(lanes + 12, m3);
  for (float v : lanes) best = v > best ? v : best;
#endif
  for (; i < n; ++i) best = p[i] > best ? p[i] : best;
  return best;
}

// The lowest id of the largest logit, NaN never chosen; 0 when every logit is NaN or -inf (what a
// scan that keeps the first strictly larger value returns). Two passes over 16-float blocks: the
// maximum, then the first block that holds it.
int32_t argmax_first(std::span<const float> x) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = x.size();
  const float* p = x.data();
  const float best = max_not_nan(x);
  if (best == kNegInf) return 0;
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 b = _mm_set1_ps(best);
  for (; i + 16 <= n; i += 16) {
    const __m128 e = _mm_or_ps(_mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(p + i), b), _mm_cmpeq_ps(_mm_loadu_ps(p + i + 4), b)),
                               _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(p + i + 8), b), _mm_cmpeq_ps(_mm_loadu_ps(p + i + 12), b)));
    if (_mm_movemask_ps(e) != 0) break;
  }
#endif
  for (; i < n; ++i) {
    if (p[i] == best) return int32_t(i);
  }
  return 0;  // not reached: best is one of the values
}

// cands (NaN already -inf) in more_likely order, by a stable 4-pass radix sort on the logit's bits
// (descending; -0 counted as +0, which compare equal) from id order, so equal logits stay in id
// order: the same order as a comparison sort with more_likely, without its ~17 mispredicted
// compares per candidate of a 150k vocabulary.
std::vector<Candidate> sort_by_likelihood(std::vector<Candidate> c) {
  const size_t n = c.size();
  std::vector<uint32_t> key(n), key_tmp(n);
  std::vector<Candidate> tmp(n);
  for (size_t i = 0; i < n; ++i) {
    SLUICE_CHECK(c[i].id == int32_t(i), "sort_by_likelihood: candidates must start in id order");
    const float l = c[i].logit == 0.0f ? 0.0f : c[i].logit;
    const uint32_t b = std::bit_cast<uint32_t>(l);
    key[i] = ~((b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u));  // ascending key = descending logit
  }
  for (int shift = 0; shift < 32; shift += 8) {
    size_t start[257] = {};
    for (size_t i = 0; i < n; ++i) ++start[((key[i] >> shift) & 0xFFu) + 1];
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (size_t i = 0; i < n; ++i) {
      const size_t to = start[(key[i] >> shift) & 0xFFu]++;
      tmp[to] = c[i];
      key_tmp[to] = key[i];
    }
    c.swap(tmp);
    key.swap(key_tmp);
  }
  return c;
}

float finite_or_minus_inf(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The k most likely of `logits` (NaN as -inf) in more_likely order. `pre`: candidates whose
// logits replace the ones in `logits` (the penalized history tokens); they are offered first and
// the scan skips their ids.
std::vector<Candidate> top_k_scan(std::span<const float> logits, size_t k, std::span<const Candidate> pre) {
  SLUICE_CHECK(k >= 1 && k <= logits.size(), "top_k_scan: k outside 1 .. the vocabulary");
  std::vector<Candidate> heap;  // std heap under more_likely: front() is the least likely kept
  heap.reserve(k + 1);
  const auto offer = [&](Candidate c) {
    if (heap.size() < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), more_likely);
    } else if (more_likely(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), more_likely);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), more_likely);
    }
  };
  for (const Candidate& c : pre) offer(c);
  const auto is_pre = [&](size_t i) {
    return !pre.empty() &&
           std::find_if(pre.begin(), pre.end(), [&](const Candidate& c) { return c.id == int32_t(i); }) != pre.end();
  };
  const size_t n = logits.size();
  size_t i = 0;
  for (; i < n && heap.size() < k; ++i) {
    if (!is_pre(i)) offer({int32_t(i), finite_or_minus_inf(logits[i]), 0.0f});
  }
  // A token must beat the least likely kept one: a larger logit, or an equal one and a lower id
  // (the scan's ids only grow, but a candidate of `pre` kept earlier may have a higher one). NaN
  // fails the first test.
  float bar = heap.front().logit;
  const auto consider = [&](size_t j) {
    const float l = logits[j];
    if (!(l >= bar) || (l == bar && int32_t(j) > heap.front().id) || is_pre(j)) return;
    offer({int32_t(j), l, 0.0f});
    bar = heap.front().logit;
  };
  for (; i < n && i % 16 != 0; ++i) consider(i);
#if defined(__SSE2__)
  // Whole blocks of 16 that hold no logit >= the bar (most of them, once the heap is warm) are
  // skipped with four compares.
  const float* p = logits.data();
  for (; i + 16 <= n; i += 16) {
    const __m128 b = _mm_set1_ps(bar);
    const __m128 ge = _mm_or_ps(_mm_or_ps(_mm_cmpge_ps(_mm_loadu_ps(p + i), b), _mm_cmpge_ps(_mm_loadu_ps(p + i + 4), b)),
                                _mm_or_ps(_mm_cmpge_ps(_mm_loadu_ps(p + i + 8), b), _mm_cmpge_ps(_mm_loadu_ps(p + i + 12), b)));
    if (_mm_movemask_ps(ge) == 0) continue;
    for (size_t j = i; j < i + 16; ++j) consider(j);
  }
#endif
  for (; i < n; ++i) consider(i);
  std::sort_heap(heap.begin(), heap.end(), more_likely);
  return heap;
}

#if defined(__SSE2__)
// exp(x) for 4 floats x <= 0 (NaN and x < -87 give exp(-87), ~2e-38: nothing next to the sum's
// largest term, 1): Cephes' expf, x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), exp(r) a
// degree-5 polynomial in r, times 2^n built in the exponent bits.
__m128 exp_nonpositive(__m128 x) {
  x = _mm_max_ps(x, _mm_set1_ps(-87.0f));  // maxps returns its second operand where x is NaN
  const __m128i n = _mm_cvtps_epi32(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)));  // rounds to nearest
  const __m128 nf = _mm_cvtepi32_ps(n);
  __m128 r = _mm_sub_ps(x, _mm_mul_ps(nf, _mm_set1_ps(0.693359375f)));
  r = _mm_sub_ps(r, _mm_mul_ps(nf, _mm_set1_ps(-2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
  p = _mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), _mm_add_ps(r, _mm_set1_ps(1.0f)));
  const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n, _mm_set1_epi32(127)), 23));
  return _mm_mul_ps(p, scale);
}
#endif

}  // namespace

Status validate(const SamplerParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return invalid_argument("--temp must be a finite number >= 0 (0 = greedy), got " + num(p.temperature));
  if (p.top_k < 0) return invalid_argument("--top-k must be >= 0 (0 = disabled), got " + std::to_string(p.top_k));
  if (!std::isfinite(p.top_p) || p.top_p <= 0 || p.top_p > 1)
    return invalid_argument("--top-p must be in (0, 1] (1 = disabled), got " + num(p.top_p));
  if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1)
    return invalid_argument("--min-p must be in [0, 1] (0 = disabled), got " + num(p.min_p));
  if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0)
    return invalid_argument("--repeat-penalty must be a finite number > 0 (1 = disabled), got " +
                            num(p.repeat_penalty));
  if (p.repeat_last_n < 0)
    return invalid_argument("--repeat-last-n must be >= 0 (0 = disabled), got " + std::to_string(p.repeat_last_n));
  return Status::ok();
}

double log_sum_exp(std::span<const float> logits) {
  const size_t n = logits.size();
  const float* p = logits.data();
  const float mx = max_not_nan(logits);
  if (!std::isfinite(mx)) return double(mx);
  size_t i = 0;
  double sum = 0;
#if defined(__SSE2__)
  const __m128 m = _mm_set1_ps(mx);
  __m128d lo = _mm_setzero_pd(), hi = _mm_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m128 a = _mm_add_ps(exp_nonpositive(_mm_sub_ps(_mm_loadu_ps(p + i), m)),
                                exp_nonpositive(_mm_sub_ps(_mm_loadu_ps(p + i + 4), m)));
    const __m128 b = _mm_add_ps(exp_nonpositive(_mm_sub_ps(_mm_loadu_ps(p + i + 8), m)),
                                exp_nonpositive(_mm_sub_ps(_mm_loadu_ps(p + i + 12), m)));
    const __m128 s = _mm_add_ps(a, b);
    lo = _mm_add_pd(lo, _mm_cvtps_pd(s));
    hi = _mm_add_pd(hi, _mm_cvtps_pd(_mm_movehl_ps(s, s)));
  }
  alignas(16) double parts[4];
  _mm_store_pd(parts, lo);
  _mm_store_pd(parts + 2, hi);
  sum = (parts[0] + parts[1]) + (parts[2] + parts[3]);
#endif
  for (; i < n; ++i) {
    if (!std::isnan(p[i])) sum += std::exp(double(p[i]) - double(mx));
  }
  return double(mx) + std::log(sum);
}

std::vector<Candidate> most_likely(std::span<const float> logits, size_t k) {
  return top_k_scan(logits, k, {});
}

Sampler::Sampler(const SamplerParams& p, int n_vocab) : params_(p), n_vocab_(n_vocab), rng_(p.seed) {
  SLUICE_CHECK(validate(p).is_ok(), validate(p).message());
  SLUICE_CHECK(n_vocab > 0, "sampler needs a non-empty vocabulary");
}

void Sampler::accept(int32_t token) {
  if (params_.repeat_last_n == 0) return;
  history_.push_back(token);
  while (history_.size() > size_t(params_.repeat_last_n)) history_.pop_front();
}

std::vector<Candidate> Sampler::penalized(std::span<const float> logits) const {
  SLUICE_CHECK(logits.size() == size_t(n_vocab_),
               "logits has " + std::to_string(logits.size()) + " entries, vocabulary " + std::to_string(n_vocab_));
  std::vector<Candidate> cands(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    // NaN would break the sort's ordering; a NaN logit is treated as impossible.
    cands[i] = {int32_t(i), finite_or_minus_inf(logits[i]), 0.0f};
  }
  for (int32_t t : penalized_ids()) cands[size_t(t)].logit = penalize(cands[size_t(t)].logit);
  return cands;
}

std::vector<int32_t> Sampler::penalized_ids() const {
  std::vector<int32_t> ids;
  if (params_.repeat_penalty == 1.0f) return ids;
  // Each distinct token is penalised once, however often it repeats.
  for (int32_t t : history_) {
    if (t >= 0 && t < n_vocab_ && std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
  }
  return ids;
}

float Sampler::penalize(float logit) const {
  return logit <= 0 ? logit * params_.repeat_penalty : logit / params_.repeat_penalty;
}

std::vector<Candidate> Sampler::top_candidates(std::span<const float> logits, size_t k) const {
  SLUICE_CHECK(logits.size() == size_t(n_vocab_),
               "logits has " + std::to_string(logits.size()) + " entries, vocabulary " + std::to_string(n_vocab_));
  // The history's distinct tokens with their penalized logits go in first; the scan skips them.
  std::vector<Candidate> pre;
  for (int32_t t : penalized_ids()) pre.push_back({t, penalize(finite_or_minus_inf(logits[size_t(t)])), 0.0f});
  return top_k_scan(logits, k, pre);
}

std::vector<Candidate> Sampler::distribution(std::span<const float> logits) const {
  const size_t k = params_.top_k > 0 ? std::min(size_t(params_.top_k), logits.size()) : logits.size();
  if (params_.temperature <= 0 || k < logits.size()) {
    std::vector<Candidate> cands = top_candidates(logits, params_.temperature <= 0 ? 1 : k);
    if (params_.temperature <= 0) return {Candidate{cands[0].id, cands[0].logit, 1.0f}};
    return finish(std::move(cands));
  }
  return finish(sort_by_likelihood(penalized(logits)));
}

std::vector<Candidate> Sampler::distribution_reference(std::span<const float> logits) const {
  std::vector<Candidate> cands = penalized(logits);
  if (params_.temperature <= 0) {
    const auto best = std::min_element(cands.begin(), cands.end(), more_likely);
    return {Candidate{best->id, best->logit, 1.0f}};
  }
  const size_t k = params_.top_k > 0 ? std::min(size_t(params_.top_k), cands.size()) : cands.size();
  std::partial_sort(cands.begin(), cands.begin() + ptrdiff_t(k), cands.end(), more_likely);
  cands.resize(k);
  return finish(std::move(cands));
}

std::vector<Candidate> Sampler::finish(std::vector<Candidate> cands) const {
  if (params_.top_p < 1.0f) {
    softmax_sorted(cands, 1.0f);
    double cum = 0;
    size_t keep = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      cum += cands[i].p;
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cands.resize(keep);
  }

  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the top one always stays.
    const float threshold = cands.front().logit + std::log(params_.min_p);
    size_t keep = 1;
    while (keep < cands.size() && cands[keep].logit >= threshold) ++keep;
    cands.resize(keep);
  }

  for (auto& c : cands) c.logit /= params_.temperature;
  softmax_sorted(cands, 1.0f);
  return cands;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0 && (params_.repeat_penalty == 1.0f || history_.empty())) {
    // Greedy without a penalty to apply: the token distribution() would return (NaN treated as
    // impossible, ties to the lower id), without building its candidate list: 150k entries per
    // token and sequence were a large part of a 32-sequence server step.
    SLUICE_CHECK(logits.size() == size_t(n_vocab_),
                 "logits has " + std::to_string(logits.size()) + " entries, vocabulary " + std::to_string(n_vocab_));
    return argmax_first(logits);
  }
  const std::vector<Candidate> dist = distribution(logits);
  if (dist.size() == 1) return dist.front().id;  // greedy or one survivor: no draw consumed
  const double u = uniform();
  double cum = 0;
  for (const auto& c : dist) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return dist.back().id;  // u within rounding of 1
}

}  // namespace sluice::decode
