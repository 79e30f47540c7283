// Byte-level BPE (tokenizer.ggml.model = "gpt2"): split text at special tokens, split raw text
// with the model family's pre-tokenizer regexes (PCRE2, UTF + UCP, JIT), map each byte to its
// GPT-2 alphabet symbol, then apply merges lowest rank first.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <span>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace sluice::model::detail {
namespace {

// Pre-tokenizer regexes as published in each family's Hugging Face tokenizer.json. Stages are
// applied in order, each to every piece the previous stage produced; unmatched gaps are kept
// as pieces (the "Isolated" split behaviour), so no text is ever dropped.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDigit = R"(\p{N})";

struct PreTokenizerDef {
  std::array<std::string_view, 6> names;  // tokenizer.ggml.pre values (empty = unused slot)
  std::array<const char*, 4> stages;      // nullptr = unused slot
  bool ignore_merges;  // a piece that is itself a vocab entry is emitted whole (HF ignore_merges)
  bool add_bos;        // default for tokenizer.ggml.add_bos_token
};

// "default" is what GGUF converters write when they do not recognise the tokenizer; its stages
// follow llama.cpp's treatment of that value so both engines agree on such files.
constexpr std::array<PreTokenizerDef, 6> kPreTokenizers = {{
    {{"default"},
     {R"([\p{P}\$\+<=>\^~\|]+)", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"(\p{N}+)", R"([0-9][0-9][0-9])"},
     false, false},
    {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo"}, {kGpt2}, false, false},
    {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}, {kLlama3}, true, false},
    {{"smollm", "starcoder", "refact", "codeshell", "exaone"}, {kDigit, kGpt2}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2}, false, false},
    {{"tekken"}, {kTekken}, true, true},
}};

std::string supported_pre_names() {
  std::string s;
  for (const auto& def : kPreTokenizers) {
    for (std::string_view name : def.names) {
      if (name.empty()) continue;
      if (!s.empty()) s += ", ";
      s += name;
    }
  }
  return s;
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

// Per-encode() matching state: PCRE2 match data and JIT stack are not shareable across
// threads, and encode() is const and may run concurrently.
class MatchScratch {
 public:
  MatchScratch() {
    data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    // Long whitespace runs backtrack through \s+(?!\S); the default 32 KiB JIT stack is too small.
    stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    SLUICE_CHECK(data_ && context_ && stack_, "PCRE2 allocation failed");
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_match_data* data() const { return data_; }
  pcre2_match_context* context() const { return context_; }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

class Regex {
 public:
  static Result<Regex> compile(const char* pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!code) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      return internal_error(std::string("pre-tokenizer regex does not compile at offset ") + std::to_string(offset) +
                            ": " + reinterpret_cast<const char*>(msg.data()) + ": " + pattern);
    }
    // JIT is an optimisation only: without it (unsupported CPU/build) pcre2_match interprets.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    Regex r;
    r.code_.reset(code);
    return r;
  }

  // Appends the pieces of `text` (valid UTF-8) to `out`: every match, and every gap between
  // matches, in order.
  void split(std::string_view text, MatchScratch& scratch, std::vector<std::string_view>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    size_t gap_start = 0;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
    while (pos < text.size()) {
      int rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data(),
                           scratch.context());
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        // JIT stack or match limits: retry interpreted, which keeps its frames on the heap.
        rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data(),
                         scratch.context());
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        // Still failing (pathological input past every limit): the rest stays one piece, which
        // BPE still encodes losslessly.
        std::fprintf(stderr, "sluice: warning: pre-tokenizer regex failed (PCRE2 error %d); rest kept whole\n", rc);
        break;
      }
      const size_t begin = ov[0];
      const size_t end = ov[1];
      if (end == begin) {  // empty match: step one character, it joins the gap
        pos = begin + std::max<size_t>(1, utf8_valid_prefix(text, begin));
        continue;
      }
      if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
      out.push_back(text.substr(begin, end - begin));
      pos = gap_start = end;
    }
    if (gap_start < text.size()) out.push_back(text.substr(gap_start));
  }

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

struct MergeInfo {
  int32_t rank;
  int32_t result;
};

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Per-call merge state, reused across the pieces of one encode() call.
struct Symbol {
  int32_t id;    // token id, -1 when the byte has no token; -2 once merged into its left neighbour
  int32_t prev;  // index of previous live symbol, -1 at the start
  int32_t next;  // index of next live symbol, -1 at the end
};
struct Candidate {
  int32_t rank;
  int32_t left;  // symbol index
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t result;
  // Lowest rank first, then leftmost: Hugging Face's order, which decides overlapping pairs
  // such as "a a a".
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

class BpeTokenizer final : public TokenizerBase {
 public:
  Status init(const VocabSpec& spec) {
    const std::string pre = spec.pre.empty() ? "default" : spec.pre;
    const PreTokenizerDef* def = nullptr;
    for (const auto& d : kPreTokenizers) {
      if (std::find(d.names.begin(), d.names.end(), pre) != d.names.end()) def = &d;
    }
    if (!def) {
      // A wrong split silently changes every prompt's ids, so an unknown family is an error
      // rather than a guess.
      return unsupported("tokenizer.ggml.pre = \"" + pre + "\" is not a supported pre-tokenizer (supported: " +
                         supported_pre_names() + ")");
    }
    if (spec.pre.empty()) {
      std::fprintf(stderr, "sluice: warning: tokenizer.ggml.pre missing; using the \"default\" pre-tokenizer\n");
    }
    for (const char* stage : def->stages) {
      if (!stage) break;
      SLUICE_ASSIGN_OR_RETURN(Regex r, Regex::compile(stage));
      stages_.push_back(std::move(r));
    }
    ignore_merges_ = def->ignore_merges;
    SLUICE_RETURN_IF_ERROR(init_common(spec, def->add_bos));

    for (int b = 0; b < 256; ++b) byte_token_[b] = find_token(alphabet_.encode(static_cast<uint8_t>(b)));

    if (spec.merges.empty()) return corrupt_file("tokenizer.ggml.merges is missing or empty (required for gpt2 BPE)");
    merges_.reserve(spec.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const std::string& m = spec.merges[rank];
      const auto bad = [&](const std::string& why) {
        return corrupt_file("tokenizer.ggml.merges[" + std::to_string(rank) + "] = \"" + m + "\": " + why);
      };
      // Byte-level symbols never contain a raw space (it is U+0120), so the first space
      // after the first byte separates the pair.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size()) return bad("expected \"left right\"");
      const std::string_view left(m.data(), sp);
      const std::string_view right(m.data() + sp + 1, m.size() - sp - 1);
      const int32_t l = find_token(left);
      const int32_t r = find_token(right);
      if (l < 0) return bad("left part \"" + std::string(left) + "\" is not a token");
      if (r < 0) return bad("right part \"" + std::string(right) + "\" is not a token");
      joined.assign(left);
      joined.append(right);
      const int32_t result = find_token(joined);
      if (result < 0) return bad("merged \"" + joined + "\" is not a token");
      merges_.emplace(pair_key(l, r), MergeInfo{static_cast<int32_t>(rank), result});  // first rank wins
    }
    return Status::ok();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    MatchScratch scratch;
    Work work;
    for (const Fragment& f : fragments(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      pre_tokenize(f.text, scratch, work);
      for (std::string_view piece : work.pieces) encode_piece(piece, work, out);
    }
    return out;
  }

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= n_vocab()) return {};
    const std::string& text = tokens_[static_cast<size_t>(id)];
    const TokenType t = type(id);
    if (t == TokenType::kControl || t == TokenType::kUserDefined) return text;
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      const size_t n = utf8_valid_prefix(text, i);
      if (n == 0) {  // not UTF-8: pass the byte through
        out += text[i++];
        continue;
      }
      const int b = alphabet_.decode(utf8_decode(text, i));
      if (b >= 0) {
        out += static_cast<char>(b);
      } else {
        out.append(text, i, n);  // outside the byte alphabet: literal text
      }
      i += n;
    }
    return out;
  }

  bool strips_leading_space() const override { return false; }

 private:
  struct Work {
    std::vector<std::string_view> pieces, next;
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    std::string mapped;
  };

  void pre_tokenize(std::string_view text, MatchScratch& scratch, Work& w) const {
    w.pieces.clear();
    // PCRE2 in UTF mode needs valid UTF-8: regex-split the valid runs, and make every
    // invalid byte a piece of its own (it still encodes through its byte token).
    size_t run = 0;
    for (size_t i = 0; i < text.size();) {
      const size_t n = utf8_valid_prefix(text, i);
      if (n > 0) {
        i += n;
        continue;
      }
      if (i > run) w.pieces.push_back(text.substr(run, i - run));
      w.pieces.push_back(text.substr(i, 1));
      run = ++i;
    }
    if (run < text.size()) w.pieces.push_back(text.substr(run));

    for (const Regex& stage : stages_) {
      w.next.clear();
      for (std::string_view piece : w.pieces) {
        if (piece.size() == 1 && utf8_valid_prefix(piece, 0) == 0) {
          w.next.push_back(piece);
        } else {
          stage.split(piece, scratch, w.next);
        }
      }
      w.pieces.swap(w.next);
    }
  }

  void try_push(Work& w, int32_t left) const {
    if (left < 0) return;
    const int32_t right = w.symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int32_t l = w.symbols[static_cast<size_t>(left)].id;
    const int32_t r = w.symbols[static_cast<size_t>(right)].id;
    if (l < 0 || r < 0) return;
    const auto it = merges_.find(pair_key(l, r));
    if (it == merges_.end()) return;
    w.heap.push_back({it->second.rank, left, right, l, r, it->second.result});
    std::push_heap(w.heap.begin(), w.heap.end());
  }

  void encode_piece(std::string_view piece, Work& w, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
      w.mapped.clear();
      for (char c : piece) w.mapped += alphabet_.encode(static_cast<uint8_t>(c));
      const int32_t whole = find_token(w.mapped);
      if (whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    const auto n = static_cast<int32_t>(piece.size());
    w.symbols.resize(piece.size());
    for (int32_t i = 0; i < n; ++i) {
      w.symbols[static_cast<size_t>(i)] = {byte_token_[static_cast<uint8_t>(piece[static_cast<size_t>(i)])], i - 1,
                                           i + 1 < n ? i + 1 : -1};
    }
    w.heap.clear();
    for (int32_t i = 0; i + 1 < n; ++i) try_push(w, i);
    while (!w.heap.empty()) {
      std::pop_heap(w.heap.begin(), w.heap.end());
      const Candidate c = w.heap.back();
      w.heap.pop_back();
      Symbol& left = w.symbols[static_cast<size_t>(c.left)];
      Symbol& right = w.symbols[static_cast<size_t>(c.right)];
      // Stale candidate: one side has merged since it was queued.
      if (left.next != c.right || left.id != c.left_id || right.id != c.right_id) continue;
      left.id = c.result;
      left.next = right.next;
      if (right.next >= 0) w.symbols[static_cast<size_t>(right.next)].prev = c.left;
      right.id = -2;
      try_push(w, left.prev);
      try_push(w, c.left);
    }
    for (int32_t i = 0; i >= 0 && i < n; i = w.symbols[static_cast<size_t>(i)].next) {
      const int32_t id = w.symbols[static_cast<size_t>(i)].id;
      // A byte the vocabulary has no symbol for is dropped, as Hugging Face and llama.cpp
      // do (the unknown id of byte-level vocabularies is often <|endoftext|>, which must not
      // appear in the middle of a prompt).
      if (id >= 0) out.push_back(id);
    }
  }

  std::vector<Regex> stages_;
  bool ignore_merges_ = false;
  ByteAlphabet alphabet_;
  std::array<int32_t, 256> byte_token_{};
  std::unordered_map<uint64_t, MergeInfo> merges_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(const VocabSpec& spec) {
  auto tok = std::make_unique<BpeTokenizer>();
  SLUICE_RETURN_IF_ERROR(tok->init(spec));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace sluice::model::detail
