// Finds added tokens in text: at each position the longest token starting there wins and the
// scan resumes after it (leftmost-longest, as HF's added-vocabulary splitter).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::tokenizer_detail {

class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;  // non-empty
    int32_t id;
  };
  struct Segment {
    size_t begin;
    size_t end;
    int32_t token_id;  // -1: plain text between tokens
  };

  explicit AddedTokenMatcher(std::vector<Token> tokens = {});

  bool empty() const { return tokens_.empty(); }
  // Appends the segments of `text` (plain text runs and tokens, in order) to `out`.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  std::vector<Token> tokens_;  // grouped by first byte, longest first within a group
  std::array<uint32_t, 257> first_byte_start_{};  // tokens_[start[b], start[b+1]) begin with b
};

}  // namespace pdserve::tokenizer_detail
