// Decides after each generated token whether a sequence is finished, and which tokens must not
// be sampled yet so that it runs for at least min_tokens.
//
// Rules (vLLM v1's check_stop and min-tokens logits processor), with n generated tokens:
//  * n >= max_tokens: kLength, checked first, so a stop token that is also the max_tokens-th
//    token reports kLength, as vLLM does.
//  * n < min_tokens: kNone whatever the last token is. The sampler should not have produced
//    a stop token at all: until min_tokens, min_tokens_banned_ids() (EOS ids unless
//    ignore_eos, and stop_token_ids) are given -inf logits, either by sample()'s banned ids
//    or by apply_min_tokens_mask(). Unlike vLLM, which also masks EOS under ignore_eos, EOS
//    is not masked when it cannot end the sequence.
//  * last token is one of the model's EOS ids and !ignore_eos: kStop.
//  * last token is in stop_token_ids: kStop (whatever ignore_eos says).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

enum class FinishReason { kNone, kStop, kLength };

// The OpenAI finish_reason: "stop", "length"; "" for kNone.
std::string_view finish_reason_name(FinishReason reason);

class StopChecker {
 public:
  // Checks params.validate(vocab_size) and that every EOS id lies in [0, vocab_size).
  static Result<StopChecker> create(const SamplingParams& params,
                                    std::span<const int32_t> eos_token_ids, int vocab_size);

  // Call with all tokens generated so far, after appending each new one.
  FinishReason check(std::span<const int32_t> output_tokens) const;

  // The ids to ban at the step that generates token number num_output_tokens + 1: the stop
  // set while num_output_tokens < min_tokens, empty afterwards.
  std::span<const int32_t> min_tokens_banned_ids(size_t num_output_tokens) const;
  // Sets the logits of min_tokens_banned_ids(num_output_tokens) to -inf. InvalidArgument
  // when logits.size() is not the vocabulary size given to create().
  Status apply_min_tokens_mask(std::span<float> logits, size_t num_output_tokens) const;

 private:
  StopChecker() = default;

  size_t vocab_size_ = 0;
  size_t max_tokens_ = 0;
  size_t min_tokens_ = 0;
  std::vector<int32_t> eos_ids_;     // empty when ignore_eos
  std::vector<int32_t> stop_ids_;    // params.stop_token_ids
  std::vector<int32_t> banned_ids_;  // eos_ids_ and stop_ids_, sorted, without repeats
};

}  // namespace pdserve
