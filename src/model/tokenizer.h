// Tokenizer built from GGUF metadata (tokenizer.ggml.*): byte-level BPE (gpt2 / llama-bpe
// family, pre-tokenizer chosen by tokenizer.ggml.pre) and SentencePiece (llama 2 style).
// (Contract shared between folders: extend, don't break.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sluice::gguf {
class File;
}

namespace sluice::model {

// tokenizer.ggml.token_type values (llama.cpp's numbering, which GGUF files carry).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special: recognised in text only with parse_special (<|im_start|>, <s>)
  kUserDefined = 4,  // always recognised in text as a whole, never split by BPE
  kUnused = 5,
  kByte = 6,         // SentencePiece byte fallback, text "<0xXX>"
};

// The tokenizer.ggml.* metadata, decoded and validated by read_vocab() (or built by hand in
// tests). Optional fields left unset take the per-model defaults documented below.
struct VocabSpec {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (byte-level BPE) | "llama" (SPM)
  std::string pre;                   // tokenizer.ggml.pre (BPE pre-tokenizer); "" = "default"
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens; index = id
  std::vector<TokenType> types;      // tokenizer.ggml.token_type; empty = all kNormal
  std::vector<float> scores;         // tokenizer.ggml.scores (SPM merge priority); may be empty
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right", rank = index (BPE)
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;  // *_token_id, -1 = none
  int add_bos = -1;           // tokenizer.ggml.add_bos_token; -1 = default (SPM yes, BPE no)
  int add_space_prefix = -1;  // tokenizer.ggml.add_space_prefix; -1 = default (SPM yes, BPE no)
};

// Reads and validates tokenizer.ggml.* (errors name the key and the offending value).
Result<VocabSpec> read_vocab(const gguf::File& file);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& file);
  // Same, from decoded metadata. Errors: unknown model or pre-tokenizer (kUnsupported), ids
  // out of range, merges naming unknown tokens (kCorruptFile).
  static Result<std::unique_ptr<Tokenizer>> from_vocab(const VocabSpec& spec);

  // add_bos: prepend BOS when the model asks for it (tokenizer.ggml.add_bos_token).
  // parse_special: recognise special/control token strings (e.g. "<|im_start|>") in text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;
  // Raw bytes of one token (byte-fallback and byte-level tokens decoded); may be a partial
  // UTF-8 sequence. Use Detokenizer for streaming text.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Concatenated token_bytes. Control tokens decode to their text ("<|im_end|>"); callers that
  // must hide them check is_control(). SPM with add_space_prefix: the space that encode()
  // prepends is removed from the first non-control token, so decode(encode(x)) == x.
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int n_vocab() const = 0;
  virtual int32_t bos() const = 0;          // -1 if none
  virtual int32_t eos() const = 0;          // -1 if none
  virtual bool is_end_of_generation(int32_t id) const = 0;  // EOS, EOT, <|im_end|>, ...
  virtual bool add_bos_default() const = 0;
  virtual int32_t find_token(std::string_view text) const = 0;  // exact vocab entry or -1
  virtual bool is_control(int32_t id) const = 0;  // token_type CONTROL (BOS, <|im_start|>, ...)
  // True for SPM vocabularies whose encode() prepends a space (see decode()).
  virtual bool strips_leading_space() const = 0;
};

// Incremental detokenizer: push tokens, get back only complete UTF-8 text (held-back bytes
// are released when completed, or at flush(); bytes that can never complete a sequence are
// passed through unchanged). Strips the SPM prefix space of the first non-control token, as
// decode() does, so streaming output equals decode() of the same ids.
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool at_start_ = true;  // no non-control token seen yet
};

}  // namespace sluice::model
