// Tokenizer pieces common to BPE and SPM: vocabulary tables, special-token recognition,
// decoding and the streaming detokenizer. Model-specific encoding lives in tokenizer_bpe.cpp
// and tokenizer_spm.cpp; reading GGUF metadata in tokenizer_vocab.cpp.
#include <algorithm>
#include <array>

#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"
#include "model/unicode.h"

namespace sluice::model {
namespace detail {

void SpecialMatcher::add(std::string_view text, int32_t id, bool control) {
  if (text.empty()) return;
  size_t node = 0;
  for (char ch : text) {
    const auto b = static_cast<uint8_t>(ch);
    auto it = nodes_[node].next.find(b);
    if (it == nodes_[node].next.end()) {
      nodes_.emplace_back();
      it = nodes_[node].next.emplace(b, static_cast<int32_t>(nodes_.size() - 1)).first;
    }
    node = static_cast<size_t>(it->second);
  }
  // Duplicate strings: the first (lowest) id wins, as it does in token_to_id_.
  if (nodes_[node].id < 0) {
    nodes_[node].id = id;
    nodes_[node].control = control;
  }
}

std::vector<Fragment> SpecialMatcher::split(std::string_view text, bool parse_special) const {
  std::vector<Fragment> out;
  size_t raw_start = 0;
  size_t i = 0;
  const auto& root = nodes_[0].next;
  while (i < text.size()) {
    size_t best_len = 0;
    int32_t best_id = -1;
    if (!root.empty()) {
      size_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        const auto& next = nodes_[node].next;
        const auto it = next.find(static_cast<uint8_t>(text[j]));
        if (it == next.end()) break;
        node = static_cast<size_t>(it->second);
        const Node& n = nodes_[node];
        if (n.id >= 0 && (parse_special || !n.control)) {
          best_len = j + 1 - i;
          best_id = n.id;
        }
      }
    }
    if (best_id < 0) {
      ++i;
      continue;
    }
    if (i > raw_start) out.push_back({text.substr(raw_start, i - raw_start), -1});
    out.push_back({{}, best_id});
    i += best_len;
    raw_start = i;
  }
  if (raw_start < text.size()) out.push_back({text.substr(raw_start), -1});
  return out;
}

Status TokenizerBase::init_common(const VocabSpec& spec, bool default_add_bos) {
  const size_t n = spec.tokens.size();
  if (n == 0) return corrupt_file("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return corrupt_file("tokenizer.ggml.tokens has " + std::to_string(n) + " entries, more than int32 ids allow");
  }
  if (!spec.types.empty() && spec.types.size() != n) {
    return corrupt_file("tokenizer.ggml.token_type has " + std::to_string(spec.types.size()) +
                        " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return corrupt_file("tokenizer.ggml.scores has " + std::to_string(spec.scores.size()) +
                        " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  const std::array<std::pair<const char*, int32_t>, 6> ids = {{{"bos", spec.bos},
                                                              {"eos", spec.eos},
                                                              {"eot", spec.eot},
                                                              {"eom", spec.eom},
                                                              {"unknown", spec.unk},
                                                              {"padding", spec.pad}}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return corrupt_file(std::string("tokenizer.ggml.") + name + "_token_id = " + std::to_string(id) +
                          " is out of range (vocabulary has " + std::to_string(n) + " tokens)");
    }
  }
  tokens_ = spec.tokens;
  types_ = spec.types.empty() ? std::vector<TokenType>(n, TokenType::kNormal) : spec.types;
  token_to_id_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    token_to_id_.emplace(std::string_view(tokens_[id]), static_cast<int32_t>(id));  // first wins
    const TokenType t = types_[id];
    if (t == TokenType::kControl || t == TokenType::kUserDefined) {
      specials_.add(tokens_[id], static_cast<int32_t>(id), t == TokenType::kControl);
    }
  }
  bos_ = spec.bos;
  eos_ = spec.eos;
  unk_ = spec.unk;
  add_bos_ = spec.add_bos < 0 ? default_add_bos : spec.add_bos != 0;

  // End of generation: the declared ids plus the end-of-turn markers of common chat formats,
  // which many files do not declare as eos/eot.
  for (int32_t id : {spec.eos, spec.eot, spec.eom}) {
    if (id >= 0) eog_ids_.push_back(id);
  }
  static constexpr std::array<std::string_view, 9> kEndOfTurn = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
      "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<|return|>"};
  for (std::string_view text : kEndOfTurn) {
    const int32_t id = find_token(text);
    if (id >= 0 && (type(id) == TokenType::kControl || type(id) == TokenType::kUserDefined)) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
  return Status::ok();
}

bool TokenizerBase::is_end_of_generation(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t TokenizerBase::find_token(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool TokenizerBase::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && type(id) == TokenType::kControl;
}

}  // namespace detail

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_vocab(const VocabSpec& spec) {
  if (spec.model == "gpt2") return detail::make_bpe_tokenizer(spec);
  if (spec.model == "llama") return detail::make_spm_tokenizer(spec);
  return unsupported("tokenizer.ggml.model = \"" + spec.model +
                     "\" is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)");
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::File& file) {
  SLUICE_ASSIGN_OR_RETURN(VocabSpec spec, read_vocab(file));
  return from_vocab(spec);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool at_start = true;
  for (int32_t id : ids) {
    std::string bytes = token_bytes(id);
    if (at_start && !is_control(id)) {
      if (strips_leading_space() && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
      at_start = false;
    }
    out += bytes;
  }
  return out;
}

std::string Detokenizer::push(int32_t id) {
  std::string bytes = tok_.token_bytes(id);
  if (at_start_ && !tok_.is_control(id)) {
    if (tok_.strips_leading_space() && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
    at_start_ = false;
  }
  pending_ += bytes;
  const size_t hold = utf8_incomplete_tail(pending_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace sluice::model
