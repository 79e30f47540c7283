// Internals shared by the tokenizer implementations (not part of the model/ contract).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace sluice::model::detail {

// A piece of input text after special-token recognition: either raw text, or one token.
struct Fragment {
  std::string_view text;  // raw text (token < 0)
  int32_t token = -1;     // recognised special token id
};

// Leftmost-longest matcher for special token strings, as a byte trie (vocabularies may hold
// thousands of user-defined tokens, so no per-position scan over all of them).
class SpecialMatcher {
 public:
  void add(std::string_view text, int32_t id, bool control);
  // Splits `text` into raw fragments and recognised tokens. Control tokens are recognised only
  // when `parse_special`; user-defined tokens always.
  std::vector<Fragment> split(std::string_view text, bool parse_special) const;

 private:
  struct Node {
    std::unordered_map<uint8_t, int32_t> next;  // byte -> node index
    int32_t id = -1;
    bool control = false;
  };
  std::vector<Node> nodes_{Node{}};
};

// Vocabulary state common to BPE and SPM: token strings, types, lookup, special ids.
class TokenizerBase : public Tokenizer {
 public:
  int n_vocab() const override { return static_cast<int>(tokens_.size()); }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  bool is_end_of_generation(int32_t id) const override;
  bool add_bos_default() const override { return add_bos_; }
  int32_t find_token(std::string_view text) const override;
  bool is_control(int32_t id) const override;

 protected:
  // Validates ids and sizes and builds the lookup tables. `default_add_bos` applies when the
  // spec leaves add_bos unset.
  Status init_common(const VocabSpec& spec, bool default_add_bos);
  TokenType type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
  // Splits text at special tokens and prepends BOS when asked; the caller encodes raw text.
  std::vector<Fragment> fragments(std::string_view text, bool parse_special) const {
    return specials_.split(text, parse_special);
  }

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  // Keys view into tokens_, whose strings never move after init_common().
  std::unordered_map<std::string_view, int32_t> token_to_id_;
  std::vector<int32_t> eog_ids_;
  SpecialMatcher specials_;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false;
};

Result<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(const VocabSpec& spec);
Result<std::unique_ptr<Tokenizer>> make_spm_tokenizer(const VocabSpec& spec);

}  // namespace sluice::model::detail
