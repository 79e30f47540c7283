// UTF-8 helpers and the GPT-2 byte<->unicode alphabet used by byte-level BPE vocabularies.
// Character classes (\p{L}, \p{N}, \s) are left to PCRE2 (UTF + UCP), so no tables here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::model {

// Length in bytes of the UTF-8 sequence announced by lead byte `c`; 0 for a byte that cannot
// start a sequence (continuation byte 0x80..0xBF, or 0xF8..0xFF).
int utf8_sequence_length(uint8_t c);

// Length of the valid UTF-8 sequence starting at s[pos] (1..4), or 0 when the bytes there are
// not a complete, well-formed sequence (overlong forms, surrogates and > U+10FFFF rejected).
size_t utf8_valid_prefix(std::string_view s, size_t pos);

// Decodes the well-formed sequence at s[pos] (call only when utf8_valid_prefix() > 0).
uint32_t utf8_decode(std::string_view s, size_t pos);
void utf8_append(std::string& out, uint32_t cp);

// Number of trailing bytes of `s` that form the start of a UTF-8 sequence still waiting for
// continuation bytes (0..3). Streaming output holds these back.
size_t utf8_incomplete_tail(std::string_view s);

// GPT-2's reversible byte -> printable code point mapping: bytes that are printable Latin-1
// map to themselves, the other 68 map to U+0100.. in byte order, so every vocab string is
// printable text. Built per tokenizer (256 short strings), never global.
class ByteAlphabet {
 public:
  ByteAlphabet();
  // UTF-8 of the code point standing for byte b.
  const std::string& encode(uint8_t b) const { return to_text_[b]; }
  // The byte a code point stands for, or -1 when cp is not in the alphabet.
  int decode(uint32_t cp) const { return cp < kMaxCodePoint ? from_cp_[cp] : -1; }

 private:
  static constexpr uint32_t kMaxCodePoint = 0x144;  // 256 + 68: the largest mapped value + 1
  std::array<std::string, 256> to_text_;
  std::array<int16_t, kMaxCodePoint> from_cp_{};
};

}  // namespace sluice::model
