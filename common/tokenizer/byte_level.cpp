#include "common/tokenizer/byte_level.h"

namespace pdserve::tokenizer_detail {
namespace {

std::string utf8_of(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else {  // the alphabet stays below U+0800
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

bool is_printable_latin1(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  code_point_to_byte_.fill(-1);
  uint32_t next_extra = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const uint32_t code_point =
        is_printable_latin1(byte) ? static_cast<uint32_t>(byte) : next_extra++;
    byte_to_text_[byte] = utf8_of(code_point);
    code_point_to_byte_[code_point] = static_cast<int16_t>(byte);
  }
}

std::optional<std::string> ByteLevelAlphabet::decode_token(std::string_view token) const {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const auto lead = static_cast<uint8_t>(token[pos]);
    uint32_t code_point = 0;
    if (lead < 0x80) {
      code_point = lead;
      pos += 1;
    } else if ((lead & 0xE0) == 0xC0 && pos + 1 < token.size()) {
      code_point = ((lead & 0x1Fu) << 6) | (static_cast<uint8_t>(token[pos + 1]) & 0x3Fu);
      pos += 2;
    } else {
      return std::nullopt;
    }
    if (code_point >= code_point_to_byte_.size() || code_point_to_byte_[code_point] < 0) {
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(code_point_to_byte_[code_point]));
  }
  return bytes;
}

}  // namespace pdserve::tokenizer_detail
