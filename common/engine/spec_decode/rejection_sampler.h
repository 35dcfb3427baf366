// Verifies one sequence's draft tokens against the target model's logits (standard
// speculative sampling with deterministic proposals; Leviathan et al., Chen et al.). Position
// j's logits (after the sequence's tokens and drafts 0..j-1) go through every transform of
// common/sampling/sampler.h (bias, min_tokens ban, penalties over the output up to j,
// temperature, min-p, top-k, top-p) into the distribution p_j that non-speculative sampling
// draws from, then:
//  * draft x_j is accepted with probability p_j(x_j): greedy rows accept iff x_j is the argmax
//    (no draw); other rows draw u and accept iff u < p_j(x_j);
//  * at the first rejection the token is drawn from p_j without x_j, renormalised (greedy: the
//    argmax), and the run ends;
//  * when all k drafts are accepted, the bonus token is sampled from p_k as usual.
// Each emitted token is then distributed as non-speculative sampling would make it, and a
// greedy run equals greedy decoding token for token. Draws come from the request's generator,
// so a seeded request repeats itself (same seed, same batch, same drafts: same tokens).
// Logprobs, when asked, are those of each emitted token at its own position (raw logits).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/engine/sequence.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampler_rng.h"

namespace pdserve {

struct VerifiedRun {
  // The accepted drafts, then the correction or bonus token: num_accepted + 1 tokens.
  std::vector<SampleResult> tokens;
  int num_accepted = 0;
};

class RejectionSampler {
 public:
  // `logits`: drafts.size() + 1 rows of `vocab_size` floats, row j the target's logits after
  // the sequence's tokens and drafts[0..j). InvalidArgument for logits the sampler refuses
  // (NaN, +inf, all masked) or a wrongly sized input.
  Result<VerifiedRun> verify(const Sequence& seq, std::span<const int32_t> drafts,
                             std::span<const float> logits, int vocab_size, SamplerRng& rng);

 private:
  // Emitted token's logprobs at its position, when the request wants them.
  Result<SampleResult> with_logprobs(std::span<const float> row, const SamplingParams& params,
                                     int32_t token) const;

  Sampler sampler_;
  std::vector<int32_t> output_;  // the output so far, then the accepted drafts
};

}  // namespace pdserve
