// Prompt lookup (vLLM's "ngram" method): no model, only the sequence itself. For n from
// prompt_lookup_max down to prompt_lookup_min, the last n tokens are looked for earlier in
// prompt + output; at the first n that matches, the earliest occurrence wins (vLLM's choice:
// in a loop the most recent one is followed by a single token) and the (at most k) tokens that
// followed it are proposed. No match: nothing is proposed and the
// sequence decodes as usual. Helps when outputs copy from their context (code edits, quotes,
// summaries); costs O(length * (max - min + 1) * n) comparisons per sequence per step.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/engine/spec_decode/proposer.h"
#include "common/engine/spec_decode/speculative_config.h"

namespace pdserve {

// The proposal for one sequence: the continuation of the earliest occurrence of its longest
// suffix of n in [min_n, max_n] tokens, at most `max_tokens` long; empty without one.
std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int max_tokens);

class NgramProposer final : public Proposer {
 public:
  // `config.method` must be kNgram.
  explicit NgramProposer(const SpeculativeConfig& config);

  std::string_view method() const override { return "ngram"; }
  Status propose(std::span<const ProposalRequest> requests,
                 std::span<std::vector<int32_t>> proposals) override;

 private:
  int min_n_;
  int max_n_;
};

}  // namespace pdserve
