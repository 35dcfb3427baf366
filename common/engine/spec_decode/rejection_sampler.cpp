#include "common/engine/spec_decode/rejection_sampler.h"

#include <string>

namespace pdserve {

Result<SampleResult> RejectionSampler::with_logprobs(std::span<const float> row,
                                                     const SamplingParams& params,
                                                     int32_t token) const {
  if (!params.want_logprobs) return SampleResult{token, 0.0f, {}};
  return sampler_.logprobs(row, token, params.logprobs);
}

Result<VerifiedRun> RejectionSampler::verify(const Sequence& seq, std::span<const int32_t> drafts,
                                             std::span<const float> logits, int vocab_size,
                                             SamplerRng& rng) {
  const size_t vocab = static_cast<size_t>(vocab_size);
  if (vocab == 0 || logits.size() != (drafts.size() + 1) * vocab) {
    return invalid_argument("verify: " + std::to_string(drafts.size()) + " drafts need " +
                            std::to_string(drafts.size() + 1) + " logits rows of " +
                            std::to_string(vocab) + ", got " + std::to_string(logits.size()) +
                            " floats");
  }
  const SamplingParams& params = seq.sampling_params();
  const bool greedy = params.temperature < kGreedyTemperature;
  output_.assign(seq.output_tokens().begin(), seq.output_tokens().end());
  VerifiedRun run;
  for (size_t j = 0;; ++j) {
    const std::span<const float> row = logits.subspan(j * vocab, vocab);
    const std::span<const int32_t> banned =
        seq.stop_checker().min_tokens_banned_ids(output_.size());
    if (j == drafts.size()) {
      // Every draft was accepted: the bonus token, sampled as without speculation.
      PDS_ASSIGN_OR_RETURN(SampleResult bonus,
                           sampler_.sample(row, params, seq.prompt_tokens(), output_, rng, banned));
      run.tokens.push_back(std::move(bonus));
      return run;
    }
    PDS_ASSIGN_OR_RETURN(std::vector<TokenProbability> distribution,
                         sampler_.distribution(row, params, seq.prompt_tokens(), output_, banned));
    const int32_t draft = drafts[j];
    double draft_probability = 0.0;
    for (const TokenProbability& entry : distribution) {
      if (entry.token == draft) draft_probability = entry.probability;
    }
    const bool accepted = greedy ? draft_probability > 0.0
                                 : draft_probability > 0.0 && rng.next_unit() < draft_probability;
    if (accepted) {
      PDS_ASSIGN_OR_RETURN(SampleResult token, with_logprobs(row, params, draft));
      run.tokens.push_back(std::move(token));
      ++run.num_accepted;
      output_.push_back(draft);
      continue;
    }
    // Rejected: the residual max(0, p - q) with q the draft's point mass is p without the
    // draft, renormalised. Greedy: the argmax, the only token left.
    const double residual_mass = 1.0 - draft_probability;
    const double target = greedy ? 0.0 : rng.next_unit() * residual_mass;
    double cumulative = 0.0;
    int32_t chosen = -1;
    for (const TokenProbability& entry : distribution) {
      if (entry.token == draft) continue;
      chosen = entry.token;
      cumulative += entry.probability;
      if (cumulative > target) break;
    }
    if (chosen < 0) return internal_error("verify: a rejected draft held all the probability");
    PDS_ASSIGN_OR_RETURN(SampleResult token, with_logprobs(row, params, chosen));
    run.tokens.push_back(std::move(token));
    return run;
  }
}

}  // namespace pdserve
