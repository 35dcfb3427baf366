// A model's tokenizer as files: tokenizer.json (the vocabulary, merges, pre-tokenizer) and
// tokenizer_config.json (the chat template), their identity, and their form on the wire.
//
// The identity is what nodes advertise when they register with a proxy, so that one cluster
// tokenizes alike (the proxy's cache-aware placement hashes the nodes' token ids):
//   sha256( hex(sha256(tokenizer.json)) + "\n" + hex(sha256(tokenizer_config.json)) )
// as 64 lowercase hex digits (a missing tokenizer_config.json counts as empty). SHA-256 is
// OpenSSL's.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // empty when the model folder has none

  // <dir>/tokenizer.json (required) and <dir>/tokenizer_config.json (optional).
  static Result<TokenizerFiles> read(const std::filesystem::path& dir);
  // Writes both into `dir` (which must exist); tokenizer_config.json only when not empty.
  Status write(const std::filesystem::path& dir) const;
  std::string sha256() const;  // the identity above

  // GET /cluster/tokenizer's body: {"tokenizer_json": "...", "tokenizer_config_json": "..."}.
  nlohmann::json to_json() const;
  // InvalidArgument when a field is missing or not a string, or tokenizer_json is empty.
  static Result<TokenizerFiles> parse(const nlohmann::json& json);
};

// The SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);
// 64 lowercase hex digits: the form of a tokenizer identity.
bool is_sha256_hex(std::string_view text);

}  // namespace pdserve
