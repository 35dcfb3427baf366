// A Hugging Face tokenizer.json tokenizer of the Qwen2/Qwen3 kind: added tokens, a Unicode
// normalizer, regex pre-tokenizers, byte-level BPE and the byte-level decoder. Files using
// features outside that subset are refused at load with UNIMPLEMENTED.
//
// A Tokenizer is immutable after load and cheap to copy (it shares its tables); encode and
// decode are const and safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

namespace tokenizer_detail {
struct TokenizerTables;
}  // namespace tokenizer_detail

class Tokenizer {
 public:
  // tokenizer.json (required) plus tokenizer_config.json from the same folder when present
  // (added_tokens_decoder, split_special_tokens, clean_up_tokenization_spaces). Errors name the
  // file and the JSON location.
  static Result<Tokenizer> load(const std::filesystem::path& tokenizer_json);
  // Loads <dir>/tokenizer.json.
  static Result<Tokenizer> from_model_dir(const std::filesystem::path& dir);

  // Added tokens in the text are matched first (split_special_tokens = false), then each run of
  // plain text is normalized, split by the pre-tokenizer regexes and BPE-encoded. No special
  // tokens are added around the text. Invalid UTF-8 -> INVALID_ARGUMENT naming the byte offset.
  Result<std::vector<int32_t>> encode(std::string_view text) const;

  // Byte-level decode; byte sequences that are not valid UTF-8 become U+FFFD as in HF
  // (errors="replace"). Ids outside the vocabulary -> INVALID_ARGUMENT.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  // The raw bytes that `id` stands for in decoded text, or nullopt for an unknown id.
  std::optional<std::string_view> token_bytes(int32_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerTables> tables)
      : tables_(std::move(tables)) {}

  std::shared_ptr<const tokenizer_detail::TokenizerTables> tables_;
};

// Streaming decode for generation: ids go in one at a time and only complete UTF-8 text comes
// out, never part of a character. The concatenation of every push() result and flush() equals
// Tokenizer::decode of all the ids with the same skip_special_tokens.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false)
      : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

  // The text that `id` completes (possibly empty). An unknown id -> INVALID_ARGUMENT and no
  // change of state.
  Result<std::string> push(int32_t id);
  // Ends the stream: an unfinished character left over becomes U+FFFD. The detokenizer is then
  // empty and can start a new stream.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of a character that is not complete yet
};

}  // namespace pdserve
