#include "common/tokenizer/added_tokens.h"

#include <algorithm>

namespace pdserve::tokenizer_detail {

AddedTokenMatcher::AddedTokenMatcher(std::vector<Token> tokens) : tokens_(std::move(tokens)) {
  std::sort(tokens_.begin(), tokens_.end(), [](const Token& a, const Token& b) {
    const auto a_first = static_cast<uint8_t>(a.content[0]);
    const auto b_first = static_cast<uint8_t>(b.content[0]);
    return a_first != b_first ? a_first < b_first : a.content.size() > b.content.size();
  });
  size_t index = 0;
  for (int byte = 0; byte < 256; ++byte) {
    first_byte_start_[byte] = static_cast<uint32_t>(index);
    while (index < tokens_.size() && static_cast<uint8_t>(tokens_[index].content[0]) == byte)
      ++index;
  }
  first_byte_start_[256] = static_cast<uint32_t>(index);
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto first = static_cast<uint8_t>(text[pos]);
    const Token* found = nullptr;
    for (uint32_t i = first_byte_start_[first]; i < first_byte_start_[first + 1]; ++i) {
      if (text.substr(pos).starts_with(tokens_[i].content)) {
        found = &tokens_[i];
        break;  // longest first
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    if (pos > plain_begin) out.push_back({plain_begin, pos, -1});
    out.push_back({pos, pos + found->content.size(), found->id});
    pos += found->content.size();
    plain_begin = pos;
  }
  if (text.size() > plain_begin) out.push_back({plain_begin, text.size(), -1});
}

}  // namespace pdserve::tokenizer_detail
