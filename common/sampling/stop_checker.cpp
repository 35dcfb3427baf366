#include "common/sampling/stop_checker.h"

#include <algorithm>
#include <limits>
#include <string>

namespace pdserve {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "";
}

Result<StopChecker> StopChecker::create(const SamplingParams& params,
                                        std::span<const int32_t> eos_token_ids, int vocab_size) {
  PDS_RETURN_IF_ERROR(params.validate(vocab_size));
  for (size_t i = 0; i < eos_token_ids.size(); ++i) {
    if (eos_token_ids[i] < 0 || eos_token_ids[i] >= vocab_size) {
      return invalid_argument("eos_token_ids[" + std::to_string(i) +
                              "] = " + std::to_string(eos_token_ids[i]) +
                              " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  StopChecker checker;
  checker.vocab_size_ = static_cast<size_t>(vocab_size);
  checker.max_tokens_ = static_cast<size_t>(params.max_tokens);
  checker.min_tokens_ = static_cast<size_t>(params.min_tokens);
  if (!params.ignore_eos) checker.eos_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
  checker.stop_ids_ = params.stop_token_ids;
  checker.banned_ids_ = checker.eos_ids_;
  checker.banned_ids_.insert(checker.banned_ids_.end(), checker.stop_ids_.begin(),
                             checker.stop_ids_.end());
  std::sort(checker.banned_ids_.begin(), checker.banned_ids_.end());
  checker.banned_ids_.erase(std::unique(checker.banned_ids_.begin(), checker.banned_ids_.end()),
                            checker.banned_ids_.end());
  return checker;
}

FinishReason StopChecker::check(std::span<const int32_t> output_tokens) const {
  const size_t generated = output_tokens.size();
  if (generated >= max_tokens_) return FinishReason::kLength;
  if (generated == 0 || generated < min_tokens_) return FinishReason::kNone;
  const int32_t last = output_tokens.back();
  auto contains = [last](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), last) != ids.end();
  };
  if (contains(eos_ids_) || contains(stop_ids_)) return FinishReason::kStop;
  return FinishReason::kNone;
}

std::span<const int32_t> StopChecker::min_tokens_banned_ids(size_t num_output_tokens) const {
  if (num_output_tokens >= min_tokens_) return {};
  return banned_ids_;
}

Status StopChecker::apply_min_tokens_mask(std::span<float> logits, size_t num_output_tokens) const {
  if (logits.size() != vocab_size_) {
    return invalid_argument("min-tokens mask: logits hold " + std::to_string(logits.size()) +
                            " entries, the vocabulary has " + std::to_string(vocab_size_));
  }
  for (int32_t token : min_tokens_banned_ids(num_output_tokens)) {
    logits[token] = -std::numeric_limits<float>::infinity();
  }
  return {};
}

}  // namespace pdserve
