#include "common/engine/output_processor.h"

#include <chrono>
#include <utility>

#include "common/core/log.h"
#include "common/sampling/stop_checker.h"

namespace pdserve {

RequestOutput::RequestOutput(const Tokenizer& tokenizer, const InferenceRequest& request)
    : request_id(request.id),
      include_stop_str_in_output(request.include_stop_str_in_output),
      detokenizer(tokenizer, request.skip_special_tokens),
      stop_matcher(request.stop, request.include_stop_str_in_output),
      prompt_tokens(static_cast<int>(request.prompt_tokens.size())) {
  timings.arrival = request.arrival;
  // A resumed stream's client had them from the node that started it.
  if (request.sampling.prompt_logprobs && !request.resume) prompt_logprobs.emplace();
}

OutputProcessor::OutputProcessor(Tokenizer tokenizer, std::vector<int32_t> eos_token_ids,
                                 int vocab_size)
    : tokenizer_(std::move(tokenizer)),
      eos_token_ids_(std::move(eos_token_ids)),
      vocab_size_(vocab_size) {}

std::string OutputProcessor::replay_text(IncrementalDetokenizer& detokenizer,
                                         StopStringMatcher& matcher,
                                         std::span<const int32_t> tokens) const {
  std::string text;
  for (const int32_t token : tokens) {
    if (!tokenizer_.token_bytes(token).has_value()) continue;
    Result<std::string> piece = detokenizer.push(token);
    PDS_CHECK(piece.ok(), piece.status().to_string());
    text += matcher.push(*piece);
  }
  return text;
}

Status OutputProcessor::catch_up(RequestOutput& output, std::span<const int32_t> delivered) const {
  // The detokenizer and the stop-string matcher catch up on what was streamed before, so the
  // next delta starts where the client's text ends (held-back bytes included).
  std::string text = replay_text(output.detokenizer, output.stop_matcher, delivered);
  if (output.stop_matcher.match()) {
    return invalid_argument("request '" + output.request_id +
                            "' resumes a stream whose output already contains a stop string");
  }
  output.resumed = true;
  output.completion_tokens = static_cast<int>(delivered.size());
  output.resumed_text = std::move(text);
  return Status::ok_status();
}

std::optional<SequenceDelta> OutputProcessor::resumed_output_end(
    const InferenceRequest& request) const {
  const std::vector<int32_t>& output = request.resume->output_tokens;
  // validate() created the same checker.
  Result<StopChecker> checker = StopChecker::create(request.sampling, eos_token_ids_, vocab_size_);
  PDS_CHECK(checker.ok(), checker.status().to_string());
  FinishReason reason = checker->check(output);
  if (reason == FinishReason::kNone && request.stop.empty()) return std::nullopt;
  IncrementalDetokenizer detokenizer(tokenizer_, request.skip_special_tokens);
  StopStringMatcher matcher(request.stop, request.include_stop_str_in_output);
  std::string text = replay_text(detokenizer, matcher, output);
  if (reason == FinishReason::kNone) {
    if (!matcher.match()) return std::nullopt;
    reason = FinishReason::kStop;
  }
  // All the text the client has, held-back bytes included (the first node's final delta
  // flushed them), for the front end's parsers to catch up on.
  if (!matcher.match()) {
    text += matcher.push(detokenizer.flush());
    text += matcher.finish();
  }
  SequenceDelta delta;
  delta.request_id = request.id;
  delta.finished = true;
  delta.finish_reason = reason;
  delta.ended_before_resume = true;
  delta.prompt_tokens = static_cast<int>(request.prompt_tokens.size());
  delta.completion_tokens = static_cast<int>(output.size());
  delta.timings.arrival = request.arrival;
  delta.timings.finished = std::chrono::steady_clock::now();
  delta.resumed_text = std::move(text);
  return delta;
}

SequenceDelta OutputProcessor::token_delta(RequestOutput& output,
                                           const SequenceUpdate& update) const {
  ++output.completion_tokens;
  if (!output.timings.first_token) output.timings.first_token = std::chrono::steady_clock::now();
  SequenceDelta delta = make_delta(output);
  delta.token_ids.push_back(update.token);
  if (output.resumed_text) {
    delta.resumed_text = std::move(output.resumed_text);
    output.resumed_text.reset();
  }
  if (output.prompt_logprobs && !output.prompt_logprobs_delivered) {
    delta.prompt_logprobs = std::move(*output.prompt_logprobs);
    output.prompt_logprobs_delivered = true;
  }
  if (output.step_logprobs) {
    delta.logprobs.push_back(std::move(*output.step_logprobs));
    output.step_logprobs.reset();
  }

  // An EOS or stop token ends the text without showing up in it (vLLM's rule).
  const bool ended_by_stop_token = update.finish_reason == FinishReason::kStop;
  const bool has_text = (!ended_by_stop_token || output.include_stop_str_in_output) &&
                        tokenizer_.token_bytes(update.token).has_value();
  std::string text;
  if (has_text) {
    // Only unknown ids fail, and those were filtered out above.
    Result<std::string> piece = output.detokenizer.push(update.token);
    PDS_CHECK(piece.ok(), piece.status().to_string());
    text = output.stop_matcher.push(*piece);
  }
  FinishReason reason = update.finish_reason;
  if (!output.stop_matcher.match() && reason != FinishReason::kNone) {
    text += output.stop_matcher.push(output.detokenizer.flush());
  }
  if (const std::optional<StopMatch>& match = output.stop_matcher.match()) {
    reason = FinishReason::kStop;
    delta.matched_stop = match->stop;
  } else if (reason != FinishReason::kNone) {
    text += output.stop_matcher.finish();
  }
  delta.text = std::move(text);
  if (reason != FinishReason::kNone) {
    delta.finished = true;
    delta.finish_reason = reason;
  }
  return delta;
}

SequenceDelta OutputProcessor::make_delta(const RequestOutput& output) {
  SequenceDelta delta;
  delta.request_id = output.request_id;
  delta.prompt_tokens = output.prompt_tokens;
  delta.completion_tokens = output.completion_tokens;
  delta.cached_prompt_tokens = output.cached_prompt_tokens;
  delta.timings = output.timings;
  delta.remote_prefill = output.remote_prefill;
  delta.spec_decode = output.spec_decode;
  return delta;
}

}  // namespace pdserve
