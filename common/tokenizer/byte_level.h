// The GPT-2 byte-level alphabet: every byte is shown as one printable Unicode character so that
// BPE vocabularies can be stored as text. Printable Latin-1 bytes map to themselves; the other
// 68 bytes map, in order, to U+0100 and up.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve::tokenizer_detail {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  // The UTF-8 form of the character standing for `byte`.
  const std::string& encode_byte(uint8_t byte) const { return byte_to_text_[byte]; }
  // Converts a vocabulary token back to raw bytes; nullopt if some character of `token` is
  // not in the alphabet (such tokens, e.g. added tokens, are used verbatim).
  std::optional<std::string> decode_token(std::string_view token) const;

 private:
  std::array<std::string, 256> byte_to_text_;
  std::array<int16_t, 512> code_point_to_byte_;  // -1 where not in the alphabet
};

}  // namespace pdserve::tokenizer_detail
