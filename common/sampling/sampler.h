// Picks the next token of one sequence from its float logits on the host. A batch is a loop
// the caller runs, one Sampler per thread. The CUDA backend implements the same semantics; this
// file is their specification.
//
// Semantics of Sampler::sample (those of vLLM v1's sampler), with V = logits.size():
//  0. Input checks: params.validate(V); every prompt, output and banned id lies in [0, V);
//     no logit is NaN or +inf (-inf marks a token that can never be chosen). Any failure is
//     InvalidArgument naming the parameter, list and position.
//  1. Logprobs, when params.want_logprobs, come from the log-softmax of the RAW logits (before
//     any step below; vLLM's default "raw_logprobs"), accumulated in double:
//     SampleResult::logprob is the sampled token's, top_logprobs the params.logprobs tokens
//     with the highest raw logits, best first, ties to the lower id. Without want_logprobs,
//     logprob is 0 and top_logprobs empty.
//  2. params.logit_bias is added to its tokens' logits (vLLM applies it before the penalties
//     too); then banned ids (e.g. EOS before min_tokens, see stop_checker.h) get logit -inf.
//  3. Penalties, in this order, in float: repetition_penalty r over every distinct id of
//     prompt + output (once per id, whatever its count): l = l > 0 ? l / r : l * r; then
//     frequency f and presence p over output ids with count c > 0: l = l - f * c, then
//     l = l - p. A penalty that overflows a logit to +inf is InvalidArgument.
//     If every logit is now -inf the result is InvalidArgument.
//  4. temperature < kGreedyTemperature: the token with the largest logit, ties to the lowest
//     id; top-k/top-p/min-p are ignored and the RNG is not used.
//  5. Otherwise each token gets the weight w = exp((l - l_max) / temperature), proportional to
//     softmax(l / temperature), and the candidate set is cut down in this order:
//       a. min_p > 0: drop tokens with w < min_p (probability < min_p * max probability);
//       b. 1 <= top_k < V: drop tokens whose logit is below the top_k-th largest logit
//          (counting repeats); tokens tied with it all stay, so more than top_k may remain;
//       c. top_p < 1: order the remaining tokens by weight, largest first, ties to the lower
//          id, and keep the shortest prefix whose weight sum (in double) reaches top_p times
//          the sum over all remaining tokens; at least one token always remains.
//     a and b commute; vLLM v1 also applies min_p (a logits processor) before top-k/top-p, so
//     top_p's mass is that of the set left after min_p and top_k. Tokens whose weight
//     underflows to 0 are dropped everywhere, as they can never be drawn.
//  6. One draw u = rng.next_unit() in [0, 1); walking the kept tokens in ascending id order
//     while summing their weights in double, the first token whose running sum exceeds
//     u * (total kept weight) is chosen.
// Test only: while output_tokens.size() is below params.scripted_output.size(), the result is
// its next token instead of steps 4 to 6 (no draw); logprobs are still step 1's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/sampling/sampler_rng.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

// vLLM's _SAMPLING_EPS: below this temperature sampling is greedy.
inline constexpr float kGreedyTemperature = 1e-5f;

// Whether Sampler::sample draws from the request's generator (step 6) for a sequence with
// `num_output_tokens` output tokens: not while scripted_output lasts, not when greedy. A
// sampler on another device draws u on the host by this rule, so that seeds, resumed streams
// and exported generator states stay what the host sampler makes them.
inline bool sampler_draws(const SamplingParams& params, size_t num_output_tokens) {
  return num_output_tokens >= params.scripted_output.size() &&
         params.temperature >= kGreedyTemperature;
}

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampleResult {
  int32_t token;
  float logprob;
  std::vector<TokenLogprob> top_logprobs;
};

struct TokenProbability {
  int32_t token;
  double probability;
};

// Owns the scratch buffers that sampling a large vocabulary needs, so that repeated calls do
// not allocate. Not thread-safe: use one per thread.
class Sampler {
 public:
  // One draw from the distribution described at the top of this file.
  Result<SampleResult> sample(std::span<const float> logits, const SamplingParams& params,
                              std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> output_tokens, SamplerRng& rng,
                              std::span<const int32_t> banned_token_ids = {});

  // sample() with the draw given: `unit` stands for rng.next_unit() and is read only when
  // sampler_draws(params, output_tokens.size()). sample() is this with the draw taken from
  // `rng` exactly then (after the input checks pass).
  Result<SampleResult> sample_with_unit(std::span<const float> logits,
                                        const SamplingParams& params,
                                        std::span<const int32_t> prompt_tokens,
                                        std::span<const int32_t> output_tokens, double unit,
                                        std::span<const int32_t> banned_token_ids = {});

  // Step 1 alone, for a token chosen elsewhere (a device sampler): the log-softmax of `logits`
  // at `token` and the `top` best alternatives, as sample() reports them with want_logprobs.
  // InvalidArgument for a NaN or +inf logit, all logits -inf, `token` outside the logits or
  // `top` outside [0, kMaxLogprobs].
  Result<SampleResult> logprobs(std::span<const float> logits, int32_t token, int top) const;

  // The distribution step 6 draws from: the kept tokens in ascending id order with their
  // probabilities (summing to 1); a single token with probability 1 when greedy. For checking
  // other implementations (e.g. the CUDA backend) against this one.
  Result<std::vector<TokenProbability>> distribution(
      std::span<const float> logits, const SamplingParams& params,
      std::span<const int32_t> prompt_tokens, std::span<const int32_t> output_tokens,
      std::span<const int32_t> banned_token_ids = {});

  // Step 3 in place on `logits`; InvalidArgument for invalid params or a token id outside
  // [0, logits.size()).
  Status apply_penalties(std::span<float> logits, const SamplingParams& params,
                         std::span<const int32_t> prompt_tokens,
                         std::span<const int32_t> output_tokens);

 private:
  struct Candidate {
    int32_t token;
    float weight;
  };

  struct Processed {
    std::span<const float> logits;  // the input itself when steps 2 and 3 change nothing
    int32_t best;                   // step 4's argmax
    int32_t raw_best;               // argmax of the raw logits, for the logprobs
  };

  // Steps 0, 2 and 3.
  Result<Processed> process_logits(std::span<const float> logits, const SamplingParams& params,
                                   std::span<const int32_t> prompt_tokens,
                                   std::span<const int32_t> output_tokens,
                                   std::span<const int32_t> banned_token_ids);
  // Step 5: fills candidates_ with the kept tokens in ascending id order.
  void select_candidates(const Processed& processed, const SamplingParams& params);
  void keep_top_p(float top_p);
  // Steps 4 to 6 and step 1 once the logits are processed; `unit` is read only when drawing.
  Result<SampleResult> finish_sample(std::span<const float> logits, const Processed& processed,
                                     const SamplingParams& params, size_t num_output_tokens,
                                     const double* unit, SamplerRng* rng);
  // Step 6.
  int32_t draw(double unit) const;

  std::vector<float> processed_;
  std::vector<uint8_t> seen_;     // per token, while applying the repetition penalty
  std::vector<int32_t> counts_;   // per token, while applying frequency/presence penalties
  std::vector<float> selection_;  // top-k threshold search
  std::vector<Candidate> candidates_;
  std::vector<Candidate> ranked_;  // candidates_ partly ordered by weight, for top-p
};

}  // namespace pdserve
