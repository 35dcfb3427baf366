#include "common/engine/spec_decode/ngram_proposer.h"

#include <algorithm>
#include <string>

namespace pdserve {

std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int min_n, int max_n,
                                  int max_tokens) {
  const int length = static_cast<int>(tokens.size());
  for (int n = std::min(max_n, length - 1); n >= min_n && max_tokens > 0; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(length - n));
    // The earliest occurrence, as vLLM picks it: in a loop the most recent one would leave a
    // single token to propose. An occurrence must have at least one token after it.
    for (int start = 0; start + n < length; ++start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int from = start + n;
      const int count = std::min(max_tokens, length - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

NgramProposer::NgramProposer(const SpeculativeConfig& config)
    : min_n_(config.prompt_lookup_min), max_n_(config.prompt_lookup_max) {}

Status NgramProposer::propose(std::span<const ProposalRequest> requests,
                              std::span<std::vector<int32_t>> proposals) {
  if (requests.size() != proposals.size()) {
    return invalid_argument("ngram proposer: " + std::to_string(requests.size()) + " requests, " +
                            std::to_string(proposals.size()) + " proposal slots");
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    proposals[i] = ngram_lookup(requests[i].tokens, min_n_, max_n_, requests[i].max_proposals);
  }
  return Status::ok_status();
}

}  // namespace pdserve
