// vLLM's --speculative-config: a JSON object choosing the proposer and how many tokens it
// guesses per step. Keys (vLLM's names): "method" ("ngram" or "draft_model"; inferred as
// "draft_model" when "model" is set and "method" is not), "num_speculative_tokens" (k, required,
// 1..kMaxSpeculativeTokens), "model" (the draft model: a folder or hub id; draft_model only),
// "prompt_lookup_min" / "prompt_lookup_max" (n-gram sizes, ngram only; vLLM's defaults: both 5
// when neither is set, else the unset one takes the other's value; 1 <= min <= max). An unknown
// key, a wrong type or a bad value is InvalidArgument naming it (the binaries exit 2 on it).
#pragma once

#include <string>
#include <string_view>

#include "common/core/status.h"

namespace pdserve {

enum class SpeculativeMethod { kNgram, kDraftModel };

std::string_view speculative_method_name(SpeculativeMethod method);

// Verify rows cost 1 + k logits rows and k KV slots each; past this the acceptance of a
// random guess falls off faster than the step's cost grows.
inline constexpr int kMaxSpeculativeTokens = 16;

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNgram;
  int num_speculative_tokens = 0;
  std::string model;  // draft_model only
  int prompt_lookup_min = 5;
  int prompt_lookup_max = 5;
};

Result<SpeculativeConfig> parse_speculative_config(std::string_view json);

}  // namespace pdserve
