// vLLM's prompt logprobs: for each prompt token after the first, its logprob under the logits
// of the position before it, its rank and the best alternatives there. Computed from raw
// logits (before any penalty or mask), as the sampled tokens' logprobs are (sampler.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/sampling/sampler.h"

namespace pdserve {

struct PromptTokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int rank = 1;                   // 1 + the number of tokens with a higher logit
  std::vector<TokenLogprob> top;  // the `top` best tokens, best first, ties to the lower id

  bool operator==(const PromptTokenLogprob& other) const;
};

// The prompt token `token` judged by the logits row of the position before it, with `top`
// alternatives. Sampler::logprobs' errors (a NaN or +inf logit, every logit -inf, `token`
// outside the row, `top` outside [0, kMaxLogprobs]).
Result<PromptTokenLogprob> prompt_token_logprob(const Sampler& sampler,
                                                std::span<const float> logits, int32_t token,
                                                int top);

}  // namespace pdserve
