// What a tokenizer.json (plus an optional tokenizer_config.json) says, checked and reduced to the
// subset this tokenizer implements: normalizer, regex pre-tokenizers, byte-level BPE, added
// tokens. Anything outside that subset is rejected with UNIMPLEMENTED rather than ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/tokenizer/normalizer.h"

namespace pdserve::tokenizer_detail {

enum class SplitBehavior { kIsolated, kRemoved };

struct SplitSpec {
  std::string pattern;  // PCRE2 syntax
  SplitBehavior behavior = SplitBehavior::kIsolated;
};

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;  // matched after normalization rather than on the raw text
};

struct TokenizerSpec {
  NormalizationForm normalization = NormalizationForm::kNone;
  std::vector<SplitSpec> splits;  // applied in order, each to the pieces of the previous one
  std::unordered_map<std::string, int32_t> vocab;           // byte-level token text -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool ignore_merges = false;  // a word found whole in the vocabulary skips the merges
  std::vector<AddedTokenSpec> added_tokens;
};

// Parses `tokenizer_json` and, when it exists beside it, tokenizer_config.json. Errors name the
// file and the JSON location ("model.merges[17]: ...").
Result<TokenizerSpec> load_tokenizer_spec(const std::filesystem::path& tokenizer_json);

}  // namespace pdserve::tokenizer_detail
