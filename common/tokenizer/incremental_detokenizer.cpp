#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace pdserve {

Result<std::string> IncrementalDetokenizer::push(int32_t id) {
  std::optional<std::string_view> bytes = tokenizer_.token_bytes(id);
  if (!bytes) {
    return invalid_argument("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                            std::to_string(tokenizer_.vocab_size()) + ")");
  }
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return std::string();
  pending_.append(*bytes);
  std::string text;
  const size_t consumed =
      tokenizer_detail::append_utf8_lossy(pending_, text, /*keep_incomplete_tail=*/true);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  tokenizer_detail::append_utf8_lossy(pending_, text, /*keep_incomplete_tail=*/false);
  pending_.clear();
  return text;
}

}  // namespace pdserve
