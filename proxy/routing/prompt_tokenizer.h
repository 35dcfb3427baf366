// The proxy's view of a prompt for cache-aware routing (prefix_routing.h): the token ids a
// decode node would make of a /v1/completions or /v1/chat/completions body, with the same code
// (the request parsers, the model's chat template and tokenizer), so that the proxy's block
// keys are the nodes' keys.
//
// Bounded work per request: only the first `max_text_bytes` of the prompt text are tokenized,
// cut where tokenization is stable (stable_text_prefix), and bodies over 4x that size are not
// parsed at all (the request is then placed by load only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include "common/chat/chat_template.h"
#include "common/core/status.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve::proxy {

enum class PromptKind { kCompletion, kChat };

struct PromptTokens {
  std::vector<int32_t> ids;
  bool whole = false;  // false: the ids are a prefix of the prompt's
};

// The longest prefix of `text` of at most `limit` bytes that tokenizes as the start of the whole
// text does: it ends right after a newline that a non-whitespace character follows (no
// pre-tokenizer chunk of Qwen's byte-level BPE, and none of its added tokens, spans such a
// point). `text` itself when it fits; empty when no such point exists.
std::string_view stable_text_prefix(std::string_view text, size_t limit);

class PromptTokenizer {
 public:
  // <dir>/tokenizer.json and the chat template of <dir>/tokenizer_config.json (a model folder).
  static Result<PromptTokenizer> load(const std::filesystem::path& dir, size_t max_text_bytes);

  // The first prompt's ids, or nullopt when the body is too large, is not a request a node
  // would take (the node answers the error), or has no stable prefix within the bound.
  std::optional<PromptTokens> tokens(PromptKind kind, std::string_view body) const;

 private:
  PromptTokenizer(Tokenizer tokenizer, ChatTemplate chat_template, size_t max_text_bytes)
      : tokenizer_(std::move(tokenizer)),
        chat_template_(std::move(chat_template)),
        max_text_bytes_(max_text_bytes) {}

  std::optional<PromptTokens> encode(std::string_view text) const;

  Tokenizer tokenizer_;
  ChatTemplate chat_template_;
  size_t max_text_bytes_;
};

}  // namespace pdserve::proxy
