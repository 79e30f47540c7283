// SentencePiece BPE as used by llama-2 style vocabularies (tokenizer.ggml.model = "llama"):
// spaces become U+2581 "▁", a "▁" is prepended to raw text at the start and after each
// special token (add_space_prefix), characters are merged greedily by the score of the merged
// piece (highest first, leftmost on ties), and pieces missing from the vocabulary fall back to
// byte tokens <0xXX> (or the unknown token when the vocabulary has no byte tokens).
#include <algorithm>
#include <array>
#include <cstdio>

#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace sluice::model::detail {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

class SpmTokenizer final : public TokenizerBase {
 public:
  Status init(const VocabSpec& spec) {
    SLUICE_RETURN_IF_ERROR(init_common(spec, /*default_add_bos=*/true));
    scores_ = spec.scores;
    add_space_prefix_ = spec.add_space_prefix != 0;  // unset (-1) means yes, as in SentencePiece
    std::array<char, 8> name{};
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name.data(), name.size(), "<0x%02X>", b);
      byte_token_[static_cast<size_t>(b)] = find_token(name.data());
    }
    return Status::ok();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    bool after_special = true;  // the start of text counts as following a special token
    std::string escaped;
    Work work;
    for (const Fragment& f : fragments(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (add_space_prefix_ && after_special) escaped += kSpace;
      for (char c : f.text) {
        if (c == ' ') {
          escaped += kSpace;
        } else {
          escaped += c;
        }
      }
      encode_text(escaped, work, out);
      after_special = false;
    }
    return out;
  }

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= n_vocab()) return {};
    const std::string& text = tokens_[static_cast<size_t>(id)];
    const TokenType t = type(id);
    if (t == TokenType::kControl || t == TokenType::kUserDefined) return text;
    if (t == TokenType::kByte && text.size() == 6 && text.starts_with("<0x") && text.back() == '>') {
      unsigned v = 0;
      if (std::sscanf(text.c_str() + 3, "%2x", &v) == 1) return std::string(1, static_cast<char>(v));
    }
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += text[i++];
      }
    }
    return out;
  }

  bool strips_leading_space() const override { return add_space_prefix_; }

 private:
  struct Symbol {
    uint32_t start;  // byte offset in the escaped text
    uint32_t len;    // bytes; 0 once merged into the left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t len;  // left.len + right.len when queued; a mismatch later marks it stale
    bool operator<(const Candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  struct Work {
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  float score(int32_t id) const { return scores_.empty() ? 0.0f : scores_[static_cast<size_t>(id)]; }

  void try_push(const std::string& text, Work& w, int32_t left) const {
    if (left < 0) return;
    const Symbol& l = w.symbols[static_cast<size_t>(left)];
    if (l.next < 0) return;
    const Symbol& r = w.symbols[static_cast<size_t>(l.next)];
    const int32_t id = find_token(std::string_view(text).substr(l.start, l.len + r.len));
    if (id < 0) return;
    w.heap.push_back({score(id), left, l.next, l.len + r.len});
    std::push_heap(w.heap.begin(), w.heap.end());
  }

  void encode_text(const std::string& text, Work& w, std::vector<int32_t>& out) const {
    w.symbols.clear();
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::max<size_t>(1, utf8_valid_prefix(text, i));  // invalid byte: alone
      const auto idx = static_cast<int32_t>(w.symbols.size());
      w.symbols.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), idx - 1, -1});
      if (idx > 0) w.symbols[static_cast<size_t>(idx - 1)].next = idx;
      i += n;
    }
    w.heap.clear();
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(w.symbols.size()); ++i) try_push(text, w, i);
    while (!w.heap.empty()) {
      std::pop_heap(w.heap.begin(), w.heap.end());
      const Candidate c = w.heap.back();
      w.heap.pop_back();
      Symbol& l = w.symbols[static_cast<size_t>(c.left)];
      if (l.len == 0 || l.next != c.right) continue;
      Symbol& r = w.symbols[static_cast<size_t>(c.right)];
      if (l.len + r.len != c.len) continue;  // one side grew since this pair was queued
      l.len += r.len;
      l.next = r.next;
      if (r.next >= 0) w.symbols[static_cast<size_t>(r.next)].prev = c.left;
      r.len = 0;
      try_push(text, w, l.prev);
      try_push(text, w, c.left);
    }
    for (int32_t i = w.symbols.empty() ? -1 : 0; i >= 0; i = w.symbols[static_cast<size_t>(i)].next) {
      const Symbol& s = w.symbols[static_cast<size_t>(i)];
      const std::string_view piece = std::string_view(text).substr(s.start, s.len);
      const int32_t id = find_token(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      const bool all_bytes = std::all_of(piece.begin(), piece.end(),
                                         [&](char c) { return byte_token_[static_cast<uint8_t>(c)] >= 0; });
      if (all_bytes) {
        for (char c : piece) out.push_back(byte_token_[static_cast<uint8_t>(c)]);
      } else if (unk_ >= 0) {
        out.push_back(unk_);
      }
    }
  }

  std::vector<float> scores_;
  bool add_space_prefix_ = true;
  std::array<int32_t, 256> byte_token_{};
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_spm_tokenizer(const VocabSpec& spec) {
  auto tok = std::make_unique<SpmTokenizer>();
  SLUICE_RETURN_IF_ERROR(tok->init(spec));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace sluice::model::detail
