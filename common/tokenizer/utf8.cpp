#include "common/tokenizer/utf8.h"

#include <cstdint>

namespace pdserve::tokenizer_detail {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed sequence starting at `pos` (1..4), or the length of the maximal
// invalid subpart as a negative number. `*incomplete` is set when the sequence is a valid
// prefix cut short by the end of the input.
int sequence_length(std::string_view s, size_t pos, bool* incomplete) {
  *incomplete = false;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return 1;
  int needed = 0;
  uint8_t low = 0x80;  // allowed range of the second byte (excludes overlongs and surrogates)
  uint8_t high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 2;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 3;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i <= needed; ++i) {
    if (pos + i >= s.size()) {
      *incomplete = true;
      return -i;
    }
    const uint8_t next = byte(pos + i);
    const uint8_t lo = i == 1 ? low : 0x80;
    const uint8_t hi = i == 1 ? high : 0xBF;
    if (next < lo || next > hi) return -i;
  }
  return needed + 1;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path, eight bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word = 0;
      for (int i = 0; i < 8; ++i)
        word |= static_cast<uint64_t>(static_cast<uint8_t>(text[pos + i])) << (8 * i);
      if ((word & 0x8080808080808080ULL) != 0) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    bool incomplete = false;
    const int length = sequence_length(text, pos, &incomplete);
    if (length < 0) return pos;
    pos += static_cast<size_t>(length);
  }
  return std::nullopt;
}

size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool keep_incomplete_tail) {
  size_t pos = 0;
  size_t valid_start = 0;  // start of the current run of valid bytes, appended in one go
  while (pos < bytes.size()) {
    bool incomplete = false;
    const int length = sequence_length(bytes, pos, &incomplete);
    if (length > 0) {
      pos += static_cast<size_t>(length);
      continue;
    }
    out.append(bytes.substr(valid_start, pos - valid_start));
    if (incomplete && keep_incomplete_tail) return pos;
    out.append(kReplacement);
    pos += static_cast<size_t>(-length);
    valid_start = pos;
  }
  out.append(bytes.substr(valid_start, pos - valid_start));
  return pos;
}

}  // namespace pdserve::tokenizer_detail
