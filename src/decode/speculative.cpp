#include "decode/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

namespace sluice::decode {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A draw from `dist` with u in [0, 1); one candidate: that one, no draw consumed (as Sampler::sample).
int32_t pick(const std::vector<Candidate>& dist, Sampler& s) {
  if (dist.size() == 1) return dist.front().id;
  const double u = s.draw_uniform();
  double cum = 0;
  for (const Candidate& c : dist) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return dist.back().id;
}

double prob_of(const std::vector<Candidate>& dist, int32_t id) {
  for (const Candidate& c : dist) {
    if (c.id == id) return c.p;
  }
  return 0;
}

// One draft token from the draft's logits: the argmax (greedy) or a draw from the filtered
// distribution, recorded in q. `hist` carries the repetition history of the drafted sequence.
int32_t draft_one(std::span<const float> logits, Sampler& hist, Sampler& rng, std::vector<std::vector<Candidate>>& q) {
  std::vector<Candidate> dist = hist.distribution(logits);
  const int32_t t = pick(dist, rng);
  if (hist.params().temperature > 0) q.push_back(std::move(dist));
  hist.accept(t);
  return t;
}

std::string describe_layers(const std::vector<bool>& run) {
  int n = 0;
  for (bool r : run) n += r;
  return std::to_string(n) + " of " + std::to_string(run.size()) + " layers";
}

}  // namespace

// ---- drafters --------------------------------------------------------------------------------

std::string ModelDrafter::describe() const { return "draft model (" + std::to_string(m_.n_vocab()) + " tokens)"; }

Status ModelDrafter::draft(std::span<const int32_t> seq, int k, Sampler& sampler, std::vector<int32_t>& tokens,
                           std::vector<std::vector<Candidate>>& q) {
  tokens.clear();
  q.clear();
  if (seq.empty() || k <= 0) return Status::ok();
  const auto t0 = Clock::now();
  // The draft must evaluate at least the last token to have logits to draft from.
  if (m_.n_past() >= int(seq.size())) m_.truncate(int(seq.size()) - 1);
  // Room in the draft's context: seq plus k - 1 drafted tokens evaluated.
  k = std::min<int64_t>(k, int64_t(m_.n_ctx()) - int64_t(seq.size()) + 1);
  if (k <= 0) return Status::ok();
  logits_.resize(size_t(m_.n_vocab()));
  // Catch up as the target computed these positions: batches before invariant_from_, row-invariant
  // passes from there on (target_row_invariant_from).
  const int n_from = m_.n_past(), n_seq = int(seq.size());
  const int split = std::clamp(invariant_from_, n_from, n_seq);
  if (split > n_from) SLUICE_RETURN_IF_ERROR(m_.eval(seq.subspan(size_t(n_from), size_t(split - n_from)), logits_));
  if (n_seq > split) {
    const bool was_invariant = m_.row_invariant();
    m_.set_row_invariant(true);
    const Status s = m_.eval(seq.subspan(size_t(split)), logits_);
    m_.set_row_invariant(was_invariant);
    SLUICE_RETURN_IF_ERROR(s);
  }
  Sampler hist = sampler;
  for (int i = 0; i < k; ++i) {
    const int32_t t = draft_one(logits_, hist, sampler, q);
    tokens.push_back(t);
    if (i + 1 == k) break;
    const int32_t one[1] = {t};
    SLUICE_RETURN_IF_ERROR(m_.eval(one, logits_));
  }
  seconds += seconds_since(t0);
  return Status::ok();
}

void ModelDrafter::rollback(int n_valid) { m_.truncate(std::min(n_valid, m_.n_past())); }

std::string SelfDrafter::describe() const { return "self-draft over " + describe_layers(run_); }

Status SelfDrafter::draft(std::span<const int32_t> seq, int k, Sampler& sampler, std::vector<int32_t>& tokens,
                          std::vector<std::vector<Candidate>>& q) {
  tokens.clear();
  q.clear();
  const int n0 = m_.n_past();
  if (seq.empty() || k <= 0) return Status::ok();
  k = std::min(k, m_.n_ctx() - n0);
  if (k <= 0) return Status::ok();
  const auto t0 = Clock::now();
  // The draft runs the target's own layers where both run (a lossy --skip-layers mask stays).
  std::vector<bool> base = m_.layer_mask();
  std::vector<bool> run = run_;
  if (!base.empty()) {
    for (size_t l = 0; l < run.size() && l < base.size(); ++l) run[l] = run[l] && base[l];
  }
  SLUICE_RETURN_IF_ERROR(m_.set_layer_mask(run));
  logits_.resize(size_t(m_.n_vocab()));
  Sampler hist = sampler;
  Status st;
  int32_t last = seq.back();
  for (int i = 0; i < k; ++i) {
    const int32_t one[1] = {last};
    st = m_.eval(one, logits_);
    if (!st.is_ok()) break;
    last = draft_one(logits_, hist, sampler, q);
    tokens.push_back(last);
  }
  // Back to the target's own layers and to where the round started: the draft's rows are stale
  // in the layers it left out and are overwritten by the verification pass.
  Status restored = m_.set_layer_mask(std::move(base));
  m_.truncate(n0);
  seconds += seconds_since(t0);
  SLUICE_RETURN_IF_ERROR(st);
  return restored;
}

// ---- the loop --------------------------------------------------------------------------------

Status validate(const SpeculativeOptions& o) {
  if (o.k < 1 || o.k > 64) return invalid_argument("--draft-k must be in [1, 64], got " + std::to_string(o.k));
  return Status::ok();
}

int choose_k(const SpecStats& s, int k_max, double draft_s_per_token) {
  if (s.drafted < 8) return k_max;  // too little seen: draft the most
  const double a = std::clamp(s.acceptance_rate(), 0.0, 0.999);
  // Verification time by K: a least-squares line through the measured passes (flat with one K).
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t k = 0; k < s.by_k.size(); ++k) {
    const SpecPassStats& p = s.by_k[k];
    if (p.passes == 0) continue;
    const double y = p.seconds / double(p.passes), w = double(p.passes);
    n += w, sx += w * double(k), sy += w * y, sxx += w * double(k) * double(k), sxy += w * double(k) * y;
  }
  if (n == 0) return k_max;
  const double den = n * sxx - sx * sx;
  const double slope = den > 1e-12 ? std::max(0.0, (n * sxy - sx * sy) / den) : 0.0;
  const double icpt = std::max(1e-9, (sy - slope * sx) / n);
  // K = 0 is plain decoding: one token per one-token pass (the line's intercept).
  int best = 0;
  double best_rate = 1.0 / icpt;
  for (int k = 1; k <= k_max; ++k) {
    const double tokens = (1 - std::pow(a, k + 1)) / (1 - a);
    const double t = std::max(1e-9, icpt + slope * k + draft_s_per_token * k);
    if (tokens / t > best_rate * (1 + 1e-9)) best_rate = tokens / t, best = k;
  }
  return best;
}

Result<Generation> generate_speculative(model::Model& target, Drafter& drafter, const model::Tokenizer& tokenizer,
                                        Sampler& sampler, std::span<const int32_t> prompt, const GenerateOptions& opts,
                                        const SpeculativeOptions& spec, const TextCallback& on_text,
                                        SpecStats* stats_out, std::span<const int32_t> cached) {
  SLUICE_RETURN_IF_ERROR(validate(spec));
  if (prompt.empty()) return invalid_argument("empty prompt: nothing to evaluate");
  const int n_ctx = target.n_ctx();
  const size_t nv = size_t(target.n_vocab());
  if (target.n_past() + int64_t(prompt.size()) > n_ctx) {
    return invalid_argument("prompt of " + std::to_string(prompt.size()) + " tokens does not fit in the context: " +
                            std::to_string(target.n_past()) + " of " + std::to_string(n_ctx) +
                            " positions already used (use a larger -c or a shorter prompt)");
  }
  // The sequence as the drafter sees it: everything the target's cache holds plus the pending
  // token. A draft model catches up on the whole of it (earlier turns and prompt included).
  const int n_before = target.n_past();
  if (!cached.empty() && int64_t(cached.size()) != n_before) {
    return invalid_argument("speculative decoding: " + std::to_string(cached.size()) +
                            " cached tokens given for a cache of " + std::to_string(n_before) + " positions");
  }
  if (n_before > 0 && cached.empty() && drafter.own_context()) {
    // Earlier turns are in the target's cache but their tokens were not given: a draft model
    // needs them too. Only a self-draft, which shares the cache, can continue without them.
    return invalid_argument("speculative decoding with a draft model: the tokens of the " + std::to_string(n_before) +
                            " positions already in the KV cache are needed");
  }
  std::vector<int32_t> seq(cached.begin(), cached.end());
  seq.insert(seq.end(), prompt.begin(), prompt.end());
  // Whatever the draft model holds past the shared history (an earlier turn's last token, which
  // the template may have re-spelled) is dropped; it re-evaluates from there.
  if (drafter.own_context()) drafter.rollback(n_before);

  Generation gen;
  SpecStats st;
  std::vector<float> logits(nv);
  SLUICE_RETURN_IF_ERROR(prefill(target, sampler, prompt, logits, gen));
  // From here on the target's passes are verification passes, row-invariant (below).
  drafter.target_row_invariant_from(n_before + int(prompt.size()));

  model::Detokenizer detok(tokenizer);
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return true;
    gen.text += piece;
    return on_text ? on_text(piece) : true;
  };
  bool stopped = false;
  // Takes one emitted token as generate() does; true when generation stops at it.
  auto take = [&](int32_t tok) {
    sampler.accept(tok);
    gen.tokens.push_back(tok);
    seq.push_back(tok);
    gen.pending = tok;
    if (tokenizer.is_end_of_generation(tok)) {
      gen.stop = StopReason::kEndOfGeneration;
      return true;
    }
    if (!tokenizer.is_control(tok) && !emit(detok.push(tok))) {
      gen.stop = StopReason::kStoppedByCaller;
      return true;
    }
    if (opts.n_predict >= 0 && int(gen.tokens.size()) >= opts.n_predict) {
      gen.stop = StopReason::kMaxTokens;
      return true;
    }
    return false;
  };

  if (opts.n_predict == 0) {
    gen.stop = StopReason::kMaxTokens;
    stopped = true;
  } else {
    stopped = take(sampler.sample(logits));
  }

  const bool greedy = sampler.params().temperature <= 0;
  std::vector<int32_t> drafts, batch;
  std::vector<std::vector<Candidate>> q;
  std::vector<float> all;
  std::vector<int32_t> out;
  int k_next = spec.k;
  while (!stopped) {
    const int n0 = target.n_past();  // the cache holds seq but its last (pending) token
    if (n0 >= n_ctx) {
      gen.stop = StopReason::kContextFull;
      break;
    }
    const auto t_round = Clock::now();
    const int64_t remaining = opts.n_predict < 0 ? std::numeric_limits<int>::max()
                                                 : int64_t(opts.n_predict) - int64_t(gen.tokens.size());
    // A round emits up to K + 1 tokens and its pass needs K + 1 positions.
    const int k = int(std::min<int64_t>({k_next, remaining - 1, int64_t(n_ctx) - n0 - 1}));
    drafts.clear();
    q.clear();
    if (k > 0) {
      const double d0 = drafter.seconds;
      if (Status s = drafter.draft(seq, k, sampler, drafts, q); !s.is_ok()) {
        return Status(s.code(), "draft at position " + std::to_string(n0) + ": " + s.message());
      }
      st.draft_s += drafter.seconds - d0;
    }
    const int kd = int(drafts.size());
    batch.assign(1, seq.back());
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    all.resize(batch.size() * nv);
    const auto t_verify = Clock::now();
    // Each row of the verification pass as a one-token pass would compute it: greedy output is
    // then plain decoding's, bit for bit (Model::set_row_invariant).
    const bool was_invariant = target.row_invariant();
    target.set_row_invariant(true);
    const Status verified = target.eval(batch, all);
    target.set_row_invariant(was_invariant);
    if (const Status& s = verified; !s.is_ok()) {
      return Status(s.code(), "verification pass at position " + std::to_string(n0) + ": " + s.message());
    }
    const double verify_s = seconds_since(t_verify);

    // Accept the longest acceptable prefix, then one token of the target's own.
    Sampler check = sampler;  // the history as each position sees it
    out.clear();
    int accepted = 0;
    for (int i = 0; i <= kd; ++i) {
      const std::span<const float> row(all.data() + size_t(i) * nv, nv);
      std::vector<Candidate> p = check.distribution(row);
      if (i == kd) {
        out.push_back(pick(p, sampler));
        break;
      }
      const int32_t d = drafts[size_t(i)];
      bool keep;
      if (greedy) {
        keep = p.front().id == d;
      } else {
        const double pd = prob_of(p, d), qd = prob_of(q[size_t(i)], d);
        keep = qd > 0 && sampler.draw_uniform() * qd < pd;
      }
      if (keep) {
        out.push_back(d);
        check.accept(d);
        ++accepted;
        continue;
      }
      if (greedy) {
        out.push_back(p.front().id);
        break;
      }
      // Rejected: a draw from the residual max(0, p - q), normalised.
      std::vector<Candidate> r;
      double mass = 0;
      for (const Candidate& c : p) {
        const double m = double(c.p) - prob_of(q[size_t(i)], c.id);
        if (m > 0) {
          r.push_back({c.id, c.logit, float(m)});
          mass += m;
        }
      }
      if (mass <= 0) {
        out.push_back(pick(p, sampler));  // p == q up to rounding: rejection had probability 0
      } else {
        for (Candidate& c : r) c.p = float(double(c.p) / mass);
        out.push_back(pick(r, sampler));
      }
      break;
    }
    // Keep the verified rows: the pending token and the accepted drafts.
    target.truncate(n0 + 1 + accepted);
    drafter.rollback(n0 + 1 + accepted);

    ++st.rounds;
    st.drafted += kd;
    st.accepted += accepted;
    st.verify_s += verify_s;
    if (st.by_k.size() <= size_t(kd)) st.by_k.resize(size_t(kd) + 1);
    st.by_k[size_t(kd)].passes++;
    st.by_k[size_t(kd)].accepted += accepted;
    st.by_k[size_t(kd)].seconds += verify_s;

    gen.pending.reset();
    for (size_t j = 0; j < out.size(); ++j) {
      ++st.emitted;
      ++gen.timings.n_decode;
      if (take(out[j])) {
        // The cache must hold the sequence up to, not including, the stopping token.
        target.truncate(n0 + 1 + int(j));
        drafter.rollback(n0 + 1 + int(j));
        stopped = true;
        break;
      }
    }
    gen.timings.decode_s += seconds_since(t_round);
    if (spec.adaptive) {
      k_next = choose_k(st, spec.k, st.drafted > 0 ? st.draft_s / double(st.drafted) : 0);
      // Plain decoding chosen: every 16th round drafts one token anyway, so that the acceptance
      // rate and the pass times keep being measured and speculation resumes when it pays again.
      if (k_next == 0 && st.rounds % 16 == 0) k_next = 1;
    }
  }
  if (gen.stop != StopReason::kStoppedByCaller) emit(detok.flush());
  if (stats_out) *stats_out = st;
  return gen;
}

std::string SpecStats::describe(const Timings& t) const {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line,
                "spec:    %lld passes, %.2f tokens per pass (%lld of %lld drafted accepted = %.1f%%); draft %.3f s, "
                "verify %.3f s; effective %.1f tok/s\n",
                static_cast<long long>(rounds), tokens_per_pass(), static_cast<long long>(accepted),
                static_cast<long long>(drafted), 100 * acceptance_rate(), draft_s, verify_s, t.decode_tok_s());
  s += line;
  for (size_t k = 0; k < by_k.size(); ++k) {
    const SpecPassStats& p = by_k[k];
    if (p.passes == 0) continue;
    std::snprintf(line, sizeof line, "spec:    K=%-2zu %5lld passes, %.2f ms per pass, %.2f accepted per pass\n", k,
                  static_cast<long long>(p.passes), p.seconds / double(p.passes) * 1e3,
                  double(p.accepted) / double(p.passes));
    s += line;
  }
  return s;
}

Status check_same_vocabulary(const std::string& target_path, const model::Tokenizer& target, int target_n_vocab,
                             const std::string& draft_path, const model::Tokenizer& draft, int draft_n_vocab) {
  auto shown = [](const std::string& t) {
    std::string s;
    for (unsigned char c : t) {
      if (c >= 0x20 && c < 0x7f && c != '"') {
        s += char(c);
      } else {
        char b[8];
        std::snprintf(b, sizeof b, "\\x%02X", c);
        s += b;
      }
    }
    return "\"" + s + "\"";
  };
  if (target_n_vocab != draft_n_vocab || target.n_vocab() != draft.n_vocab()) {
    return invalid_argument("draft model " + draft_path + " has a vocabulary of " + std::to_string(draft_n_vocab) +
                            " tokens, the model " + target_path + " " + std::to_string(target_n_vocab) +
                            ": speculative decoding needs the same vocabulary");
  }
  for (int32_t id = 0; id < target.n_vocab(); ++id) {
    const std::string a = target.token_bytes(id), b = draft.token_bytes(id);
    if (a != b) {
      return invalid_argument("draft model " + draft_path + " has a different vocabulary from " + target_path +
                              ": token " + std::to_string(id) + " is " + shown(b) + " in the draft, " + shown(a) +
                              " in the model");
    }
  }
  return Status::ok();
}

}  // namespace sluice::decode
