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

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& file);

  // add_bos: prepend BOS when the model asks for it (tokenizer.ggml.add_bos_token).
  // parse_special: recognise special/control token strings (e.g. "<|im_start|>") in text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;
  // Raw bytes of one token (byte-fallback and byte-level tokens decoded); may be a partial
  // UTF-8 sequence. Use Detokenizer for streaming text.
  virtual std::string token_bytes(int32_t id) const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;

  virtual int n_vocab() const = 0;
  virtual int32_t bos() const = 0;          // -1 if none
  virtual int32_t eos() const = 0;          // -1 if none
  virtual bool is_end_of_generation(int32_t id) const = 0;  // EOS, EOT, <|im_end|>, ...
  virtual bool add_bos_default() const = 0;
  virtual int32_t find_token(std::string_view text) const = 0;  // exact vocab entry or -1
};

// Incremental detokenizer: push tokens, get back only complete UTF-8 text (held-back bytes
// are released when completed, or at flush()).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace sluice::model
