#include "common/sampling/prompt_logprobs.h"

#include <algorithm>
#include <utility>

namespace pdserve {

bool PromptTokenLogprob::operator==(const PromptTokenLogprob& other) const {
  const auto same = [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.token == b.token && a.logprob == b.logprob;
  };
  return token == other.token && logprob == other.logprob && rank == other.rank &&
         std::ranges::equal(top, other.top, same);
}

Result<PromptTokenLogprob> prompt_token_logprob(const Sampler& sampler,
                                                std::span<const float> logits, int32_t token,
                                                int top) {
  PDS_ASSIGN_OR_RETURN(SampleResult result, sampler.logprobs(logits, token, top));
  const float own = logits[static_cast<size_t>(token)];
  const auto higher = std::ranges::count_if(logits, [own](float logit) { return logit > own; });
  return PromptTokenLogprob{token, result.logprob, 1 + static_cast<int>(higher),
                            std::move(result.top_logprobs)};
}

}  // namespace pdserve
