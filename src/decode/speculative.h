// Speculative decoding (docs/SPECULATIVE.md): a cheap drafter proposes K tokens, the target model
// checks them all in ONE forward pass of K + 1 tokens (Model::eval with every token's logits),
// and the longest acceptable prefix plus one token of the target's own is kept. When the target's
// weights cross PCIe or are read by the CPU for every pass, a pass of K + 1 tokens costs about
// what a pass of one does, so tok/s grows with the accepted tokens per pass.
//
// Exactness: the tokens are those the target alone would produce.
//   - temperature 0: a draft token is kept only when it is the target's own argmax (after the
//     repetition penalty) at its position, so the output equals generate()'s, token for token;
//   - temperature > 0: the standard rejection sampling (Leviathan et al. 2023, Chen et al. 2023):
//     draft token d drawn from the drafter's distribution q is kept with probability
//     min(1, p(d) / q(d)), p the target's distribution after the sampler's filters; at the first
//     rejection a token is drawn from normalize(max(0, p - q)); when all K are kept, one more is
//     drawn from p at the last position. Each emitted token is then distributed exactly as p.
//
// KV cache: the same invariant as generate() (decode/generate.h): on return the cache holds the
// prompt and every emitted token but the last (Generation::pending). A round starts with the
// cache holding the sequence but its last token t; the verification pass appends t, d1..dK; the
// rows past the accepted ones are dropped with Model::truncate. A self-draft pass writes KV rows
// only for the layers it runs, at the positions of t, d1..dK-1; the verification pass overwrites
// every layer's rows at those positions before any later pass reads them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "decode/generate.h"
#include "decode/sampler.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace sluice::decode {

// A source of draft tokens.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string describe() const = 0;
  // Proposes up to k tokens continuing `seq` (the whole sequence: prompt and every emitted token;
  // the target's KV cache holds all of it but the last token). Greedy samplers (temperature 0):
  // the draft's argmax at each step; otherwise a draw from the draft's distribution under the
  // sampler's filters, written to `q` (one distribution per drafted token), using `sampler`'s
  // generator for the draw. `sampler` holds the sequence's repetition history; it is not changed
  // except for its generator. May return fewer than k tokens (the draft's context is full).
  virtual Status draft(std::span<const int32_t> seq, int k, Sampler& sampler, std::vector<int32_t>& tokens,
                       std::vector<std::vector<Candidate>>& q) = 0;
  // After verification: the first n_valid tokens of the last `seq` and of the drafted tokens
  // (seq followed by drafts) are the sequence's; later draft state must go.
  virtual void rollback(int n_valid) = 0;
  // Whether the drafter keeps its own context (a draft model) and so must see the whole sequence
  // from position 0; a self-draft shares the target's KV cache and continues from anywhere.
  virtual bool own_context() const { return true; }
  // The target computes positions from `pos` on in row-invariant passes (verification: every row
  // has a one-token pass's bits; Model::set_row_invariant), the ones before as batches (the
  // prompt). A draft model computes its catch-up the same way, so that an identical draft model
  // holds the target's bits at every position and proposes exactly the target's greedy tokens.
  virtual void target_row_invariant_from(int pos) { (void)pos; }
  // Seconds spent drafting (passes of the draft), for the stats.
  double seconds = 0;
};

// A separate draft model (--draft-model): same vocabulary, its own KV cache, kept in step with the
// sequence (the tokens it has not seen are evaluated, as one batch, at the start of each draft).
class ModelDrafter final : public Drafter {
 public:
  explicit ModelDrafter(model::Model& draft) : m_(draft) {}
  std::string describe() const override;
  Status draft(std::span<const int32_t> seq, int k, Sampler& sampler, std::vector<int32_t>& tokens,
               std::vector<std::vector<Candidate>>& q) override;
  void rollback(int n_valid) override;
  void target_row_invariant_from(int pos) override { invariant_from_ = pos; }

 private:
  model::Model& m_;
  std::vector<float> logits_;
  int invariant_from_ = 0;  // target_row_invariant_from
};

// Self-draft: the target itself, running only the layers of `run` (Model::set_layer_mask): its
// resident layers when it streams, a calibrated or given subset when it is resident. The draft's
// KV rows are left for the verification pass to overwrite and the cache is truncated back to
// where the round started (no state survives a draft).
class SelfDrafter final : public Drafter {
 public:
  SelfDrafter(model::Model& target, std::vector<bool> run) : m_(target), run_(std::move(run)) {}
  std::string describe() const override;
  Status draft(std::span<const int32_t> seq, int k, Sampler& sampler, std::vector<int32_t>& tokens,
               std::vector<std::vector<Candidate>>& q) override;
  void rollback(int) override {}
  bool own_context() const override { return false; }
  const std::vector<bool>& layers() const { return run_; }

 private:
  model::Model& m_;
  std::vector<bool> run_;
  std::vector<float> logits_;
};

struct SpeculativeOptions {
  int k = 4;              // tokens drafted per pass (the most, when adaptive); >= 1
  // Choose K before each pass (0 .. k; choose_k) to maximise expected tokens per second.
  bool adaptive = false;
};
Status validate(const SpeculativeOptions& o);

struct SpecStats;
// Adaptive K: the K in [0, k_max] with the most expected tokens per second, from the running
// acceptance rate a (a pass of K drafts yields (1 - a^(K+1)) / (1 - a) tokens on average), the
// draft seconds per drafted token, and the verification pass seconds by K (a least-squares line
// through SpecStats::by_k). K = 0 is plain decoding (one token per one-token pass), chosen where
// speculation does not pay. k_max before 8 tokens have been drafted.
int choose_k(const SpecStats& s, int k_max, double draft_s_per_token);

// Verification passes that carried K drafted tokens (index K of SpecStats::by_k).
struct SpecPassStats {
  int64_t passes = 0;
  int64_t accepted = 0;  // drafted tokens kept
  double seconds = 0;    // verification pass time (the target's K + 1 token eval)
};

struct SpecStats {
  int64_t rounds = 0;    // draft + verify rounds
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens kept
  int64_t emitted = 0;   // tokens the rounds produced (kept drafts + the target's own)
  double draft_s = 0, verify_s = 0;
  std::vector<SpecPassStats> by_k;  // index: K
  double acceptance_rate() const { return drafted > 0 ? double(accepted) / double(drafted) : 0; }
  double tokens_per_pass() const { return rounds > 0 ? double(emitted) / double(rounds) : 0; }
  // "spec:    ..." lines: accepted per pass, acceptance rate, pass time by K, effective tok/s.
  std::string describe(const Timings& t) const;
};

// generate() with speculation: same arguments, result, stop conditions and KV-cache invariant;
// `stats` (optional) receives the speculation counters. `cached`: the tokens the target's cache
// already holds (chat's earlier turns, target.n_past() of them), which a draft model with its own
// context catches up on; a self-draft shares the target's cache and needs none. Errors as
// generate(), plus the drafter's, plus a draft model continuing a cache whose tokens are not given.
Result<Generation> generate_speculative(model::Model& target, Drafter& drafter, const model::Tokenizer& tokenizer,
                                        Sampler& sampler, std::span<const int32_t> prompt, const GenerateOptions& opts,
                                        const SpeculativeOptions& spec, const TextCallback& on_text,
                                        SpecStats* stats = nullptr, std::span<const int32_t> cached = {});

// A draft model must share the target's vocabulary: the same n_vocab and the same token at every
// id. Error (kInvalidArgument) naming both files and the first differing id and its two tokens.
Status check_same_vocabulary(const std::string& target_path, const model::Tokenizer& target, int target_n_vocab,
                             const std::string& draft_path, const model::Tokenizer& draft, int draft_n_vocab);

}  // namespace sluice::decode
