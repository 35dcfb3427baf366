// One client's completion or chat request in flight: its choices (one engine request each) and
// how their typed engine outputs (SequenceDelta) reach the client, whole or as an SSE stream:
// role chunks and echo, reasoning and tool-call parsing, logprobs with token strings, stream
// checkpoints for the proxy, continuous usage, the usage chunk, the timeline. What may be
// written when is ResponseLifecycle's (response_lifecycle.h). Deltas are handled on the
// connection's strand, one at a time under `mutex`; the engine thread only hands them over.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/engine/inference_service.h"
#include "common/http/response_channel.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/tool_call_parser.h"
#include "common/tokenizer/tokenizer.h"
#include "serving/openai/request_metrics.h"
#include "serving/openai/request_timeline.h"
#include "serving/openai/response_lifecycle.h"

namespace pdserve {

struct GenerationStream {
  struct Choice {
    std::string text;  // non-streaming: the echo prefix and everything generated
    std::vector<OutputTokenLogprob> logprobs;  // non-streaming, when requested
    int64_t logprob_text_offset = 0;           // code points of the token strings reported so far
    std::optional<SteadyTime> last_token_at;   // arrival of its previous delta with tokens
    FinishReason finish_reason = FinishReason::kNone;
    std::string matched_stop;  // the stop string that ended it (vLLM's stop_reason)
    int prompt_tokens = 0;
    int completion_tokens = 0;
    // A resumable stream's tokens and sampler state not yet named by a checkpoint.
    std::vector<int32_t> unnamed_tokens;
    std::optional<SamplerRng::State> sampler_state;
    // A resumed stream: the tokens of this choice the client had (their logprob offsets).
    std::vector<int32_t> resumed_token_ids;
    int prompt_length = 0;       // for continuous usage stats, before the final delta says
    int tokens_streamed = 0;     // for continuous usage stats
    bool counts_prompt = false;  // the first choice of its prompt carries the prompt usage
    std::optional<ReasoningParser> reasoning;
    bool starts_in_reasoning = false;
    // Chat requests with tools (and tool_choice not "none"): parses the content after the
    // reasoning, in streams; a whole answer is split at the end.
    std::optional<ToolCallParser> tools;
    int32_t first_prompt_token = 0;  // echo_logprobs: its entry leads, without a logprob
    bool prompt_reported = false;    // its first delta (the prompt's logprobs) was handled
    // Whole answers with prompt_logprobs: vLLM's prompt_logprobs of its prompt.
    std::optional<std::vector<PromptPositionLogprobs>> prompt_logprobs;
  };

  GenerationStream(RequestMetrics& series, const Tokenizer& token_texts,
                   std::shared_ptr<http::ResponseChannel> channel, bool chat_request,
                   bool streamed);

  // Handles one delta of choice `index`. Returns the engine requests to abort (after the
  // mutex is released) when this delta failed the whole generation: its siblings.
  std::vector<std::string> on_delta(size_t index, SequenceDelta delta, SteadyTime arrived);
  // Called with the mutex held, before any delta: a stream's head, then each chat choice's
  // role chunk or each completion choice's echoed prompt (ResponseLifecycle::open).
  void open();
  // The request was refused before any delta (a submit failed); the caller answers it.
  void answer_elsewhere();

  RequestMetrics& metrics;
  const Tokenizer& tokenizer;
  // The connection's strand, where deltas are handled (formatting, reasoning parsing,
  // metrics): the engine thread only hands them over.
  const std::shared_ptr<http::ResponseChannel> strand;
  const bool chat;
  const bool stream;
  bool want_logprobs = false;
  int top_logprobs = 0;  // alternatives per generated (or echoed) token
  // Completions with echo and logprobs: each choice's logprobs start with its prompt's tokens
  // (a stream sends the echo with the first delta, which brings their logprobs).
  bool echo_logprobs = false;
  // vLLM's prompt_logprobs: alternatives per prompt position (whole answers only).
  std::optional<int> prompt_logprobs;
  ResponseMeta meta;
  StreamOptions stream_options;
  bool continuous_usage = false;        // stream_options.continuous_usage_stats with include_usage
  std::string chat_echo;                // chat echo: the last message's content, before each answer
  std::vector<std::string> engine_ids;  // complete before any delta is handled
  std::vector<size_t> engine_choices;   // the choice of each engine request
  // A resumable stream (X-Pdserve-Resumable): a checkpoint before each event of a choice.
  bool resumable = false;
  // Continues a stream another node started (pdserve_resume): no role chunks or echo, and
  // the catch-up text of each choice's delivered tokens arrives with its first delta.
  bool resumed = false;
  // For the timeline: t = 0, whose trace this is, this node's name, and whether the caller
  // asked for it (X-Pdserve-Timeline: 1).
  SteadyTime arrival{};
  std::string trace_id;
  std::string node;
  bool wants_timeline = false;

  std::mutex mutex;
  std::vector<Choice> choices;
  size_t remaining = 0;

 private:
  void write_event(nlohmann::ordered_json payload);
  void write_checkpoint(size_t index);
  void fail(const ApiError& error);
  void write_choice_delta(size_t index, Choice& choice, SequenceDelta& delta,
                          std::optional<std::vector<OutputTokenLogprob>> logprobs,
                          int64_t text_offset_start);
  void catch_up(Choice& choice, const std::string& delivered_text);
  std::vector<OutputTokenLogprob> output_logprobs(const std::vector<SampledTokenLogprobs>& sampled,
                                                  Choice& choice) const;
  std::string token_string(int32_t id) const;
  // The first delta of a choice: its prompt's logprobs as vLLM's prompt_logprobs (kept for
  // the answer) and, for echo with logprobs, as the leading logprob entries (returned).
  std::vector<OutputTokenLogprob> report_prompt(Choice& choice,
                                                const std::vector<PromptTokenLogprob>& prompt);
  nlohmann::ordered_json timeline_json();
  void finish();
  std::string call_id(int choice_index, int call_index) const;
  std::vector<ChatToolCall> numbered_calls(int choice_index,
                                           std::vector<ParsedToolCall> parsed) const;
  std::vector<ChatToolCallDelta> streamed_calls(int choice_index,
                                                std::vector<ToolCallFragment> fragments) const;
  std::optional<std::vector<OutputTokenLogprob>> requested_logprobs(Choice& choice) const;

  std::shared_ptr<http::ResponseChannel> channel_;  // reset once answered
  ResponseLifecycle lifecycle_;
  // A stream's head normally goes out at once (clients see 200 while queued). A remotely
  // prefilled request's head waits for its first delta, so that a failure before any token
  // (the prefill node refused, the KV pool is full) is a plain HTTP error the proxy can act on.
  SteadyTime head_sent_{};
  std::vector<SteadyTime> first_choice_token_times_;
  std::vector<ChoiceTimeline> finished_choices_;
};

}  // namespace pdserve
