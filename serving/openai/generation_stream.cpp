#include "serving/openai/generation_stream.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "common/http/api_error_response.h"
#include "common/protocol/stream_event.h"
#include "common/protocol/stream_resume.h"

namespace pdserve {
namespace {

// Code points in UTF-8 text (bytes that do not continue a sequence), as the protocol layer
// counts text_offset.
int64_t code_points(std::string_view text) {
  int64_t count = 0;
  for (unsigned char byte : text) count += (byte & 0xC0) != 0x80;
  return count;
}

double seconds_between(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

http::HttpResponse json_response(int status, std::string body) {
  return {status, "application/json", {}, std::move(body)};
}

}  // namespace

GenerationStream::GenerationStream(RequestMetrics& series, const Tokenizer& token_texts,
                                   std::shared_ptr<http::ResponseChannel> channel,
                                   bool chat_request, bool streamed)
    : metrics(series),
      tokenizer(token_texts),
      strand(channel),
      chat(chat_request),
      stream(streamed),
      channel_(std::move(channel)),
      lifecycle_(streamed) {}

// Called with the mutex held: a chunk of one choice. A resumable stream's choice events follow
// their checkpoint (the usage chunk, of no choice, needs none and is written by finish()). With
// continuous usage stats every choice chunk carries its choice's usage so far (vLLM).
void GenerationStream::write_event(nlohmann::ordered_json payload) {
  if (resumable && payload["choices"].size() == 1) {
    write_checkpoint(payload["choices"][0]["index"].get<size_t>());
  }
  if (continuous_usage && payload["choices"].size() == 1) {
    const Choice& choice = choices[payload["choices"][0]["index"].get<size_t>()];
    payload["usage"] = {{"prompt_tokens", choice.prompt_length},
                        {"completion_tokens", choice.tokens_streamed},
                        {"total_tokens", choice.prompt_length + choice.tokens_streamed}};
  }
  channel_->write(to_sse(ChunkEvent::of(std::move(payload))));
}

void GenerationStream::write_checkpoint(size_t index) {
  Choice& choice = choices[index];
  channel_->write(to_sse(CheckpointEvent{{meta.id, meta.created, static_cast<int>(choices.size()),
                                          static_cast<int>(index), std::move(choice.unnamed_tokens),
                                          choice.sampler_state}}));
  choice.unnamed_tokens.clear();
}

void GenerationStream::fail(const ApiError& error) {
  switch (lifecycle_.fail()) {
    case FailureDelivery::kDropped:
      return;
    case FailureDelivery::kErrorEvent:
      metrics.count_response(200);
      channel_->write(to_sse(ErrorEvent::of(error)));
      channel_->write(to_sse(DoneEvent{}));
      channel_->end_stream();
      break;
    case FailureDelivery::kErrorResponse:
      metrics.count_response(error.http_status);
      channel_->send(http::api_error_response(error));
      break;
  }
  channel_.reset();
}

void GenerationStream::answer_elsewhere() {
  lifecycle_.answer_elsewhere();
  channel_.reset();
}

void GenerationStream::open() {
  if (!lifecycle_.open()) return;
  channel_->start_stream(200, "text/event-stream", {});
  head_sent_ = std::chrono::steady_clock::now();
  // The proxy learns the id and the number of choices at once: a stream that fails before
  // its first event can be resumed too.
  if (resumable) write_checkpoint(0);
  if (resumed) return;  // the client has its role chunk or echo already
  for (size_t i = 0; i < choices.size(); ++i) {
    const int index = static_cast<int>(i);
    if (chat) {
      write_event(chat_role_chunk(meta, stream_options, index));
      if (!chat_echo.empty()) {
        write_event(chat_delta_chunk(meta, stream_options, index, "", chat_echo, nullptr));
      }
    } else if (!choices[i].text.empty() && !echo_logprobs) {
      CompletionChoice echo;
      echo.index = index;
      echo.text = choices[i].text;
      write_event(completion_chunk(meta, stream_options, echo));
    }
  }
}

// The delta's logprobs with token strings; advances the choice's text offset past them.
std::vector<OutputTokenLogprob> GenerationStream::output_logprobs(
    const std::vector<SampledTokenLogprobs>& sampled, Choice& choice) const {
  std::vector<OutputTokenLogprob> out;
  out.reserve(sampled.size());
  for (const SampledTokenLogprobs& token : sampled) {
    OutputTokenLogprob entry;
    entry.token = token_string(token.token);
    entry.logprob = token.logprob;
    for (const TokenLogprob& alternative : token.top) {
      entry.top.push_back({token_string(alternative.token), alternative.logprob});
    }
    choice.logprob_text_offset += code_points(entry.token);
    out.push_back(std::move(entry));
  }
  return out;
}

std::vector<OutputTokenLogprob> GenerationStream::report_prompt(
    Choice& choice, const std::vector<PromptTokenLogprob>& prompt) {
  if (prompt_logprobs) {
    std::vector<PromptPositionLogprobs>& positions = choice.prompt_logprobs.emplace();
    for (const PromptTokenLogprob& position : prompt) {
      PromptPositionLogprobs& out = positions.emplace_back();
      out.entries.push_back(
          {position.token, position.logprob, position.rank, token_string(position.token)});
      const size_t top = std::min(position.top.size(), static_cast<size_t>(*prompt_logprobs));
      for (size_t rank = 0; rank < top; ++rank) {
        const TokenLogprob& alternative = position.top[rank];
        if (alternative.token == position.token) continue;
        out.entries.push_back({alternative.token, alternative.logprob, static_cast<int>(rank) + 1,
                               token_string(alternative.token)});
      }
    }
  }
  std::vector<OutputTokenLogprob> echoed;
  if (!echo_logprobs) return echoed;
  // OpenAI's and vLLM's echo: the first prompt token has no logprob (nothing comes before it).
  echoed.push_back({token_string(choice.first_prompt_token), std::nullopt, {}});
  for (const PromptTokenLogprob& position : prompt) {
    OutputTokenLogprob& entry = echoed.emplace_back();
    entry.token = token_string(position.token);
    entry.logprob = position.logprob;
    const size_t top = std::min(position.top.size(), static_cast<size_t>(top_logprobs));
    for (size_t i = 0; i < top; ++i) {
      entry.top.push_back({token_string(position.top[i].token), position.top[i].logprob});
    }
  }
  for (const OutputTokenLogprob& entry : echoed) {
    choice.logprob_text_offset += code_points(entry.token);
  }
  return echoed;
}

// An id the model can produce but the tokenizer does not know (a padding row of the
// embedding) has no text: it is reported as "".
std::string GenerationStream::token_string(int32_t id) const {
  return std::string(tokenizer.token_bytes(id).value_or(std::string_view()));
}

std::vector<std::string> GenerationStream::on_delta(size_t index, SequenceDelta delta,
                                                    SteadyTime arrived) {
  std::lock_guard lock(mutex);
  if (lifecycle_.answered()) return {};
  if (!delta.finished || delta.error.ok()) open();
  // For the timeline: a stream's tokens leave now, after its head; a whole answer's go out
  // with the body, the time they arrived stands for them.
  const SteadyTime handed_over = stream ? std::chrono::steady_clock::now() : arrived;
  Choice& choice = choices[index];
  choice.tokens_streamed += static_cast<int>(delta.token_ids.size());
  if (!delta.token_ids.empty()) {
    if (choice.last_token_at) {
      metrics.record_inter_token_latency(seconds_between(*choice.last_token_at, arrived));
    }
    choice.last_token_at = arrived;
    if (index == 0) {
      first_choice_token_times_.insert(first_choice_token_times_.end(), delta.token_ids.size(),
                                       handed_over);
    }
  }
  if (delta.finished && !delta.error.ok()) {
    fail(api_error_from_status(delta.error));
    std::vector<std::string> siblings;
    for (size_t i = 0; i < engine_ids.size(); ++i) {
      if (engine_choices[i] != index) siblings.push_back(engine_ids[i]);
    }
    return siblings;
  }
  if (delta.resumed_text) catch_up(choice, *delta.resumed_text);
  if (resumable) {
    choice.unnamed_tokens.insert(choice.unnamed_tokens.end(), delta.token_ids.begin(),
                                 delta.token_ids.end());
    if (delta.sampler_state) choice.sampler_state = delta.sampler_state;
  }
  const int64_t text_offset_start = choice.logprob_text_offset;
  std::optional<std::vector<OutputTokenLogprob>> logprobs;
  if (!choice.prompt_reported && !resumed && (!delta.token_ids.empty() || delta.finished)) {
    choice.prompt_reported = true;
    std::vector<OutputTokenLogprob> echoed = report_prompt(choice, delta.prompt_logprobs);
    if (echo_logprobs) {
      logprobs = std::move(echoed);
      // A stream's echo waited for these logprobs: it goes out in this delta's chunk.
      if (stream) delta.text = std::exchange(choice.text, "") + delta.text;
    }
  }
  if (want_logprobs && !delta.logprobs.empty()) {
    std::vector<OutputTokenLogprob> generated = output_logprobs(delta.logprobs, choice);
    if (!logprobs) logprobs.emplace();
    logprobs->insert(logprobs->end(), std::make_move_iterator(generated.begin()),
                     std::make_move_iterator(generated.end()));
  }
  write_choice_delta(index, choice, delta, std::move(logprobs), text_offset_start);
  if (!delta.finished) return {};

  choice.finish_reason = delta.finish_reason;
  choice.matched_stop = delta.matched_stop;
  choice.prompt_tokens = delta.prompt_tokens;
  choice.completion_tokens = delta.completion_tokens;
  finished_choices_.push_back({static_cast<int>(index), delta.timings, delta.remote_prefill,
                               delta.completion_tokens, handed_over, delta.spec_decode});
  metrics.record_finished(delta);
  if (--remaining == 0) finish();
  return {};
}

// A stream's events for one delta of a choice, or a whole answer's accumulation of it.
void GenerationStream::write_choice_delta(size_t index, Choice& choice, SequenceDelta& delta,
                                          std::optional<std::vector<OutputTokenLogprob>> logprobs,
                                          int64_t text_offset_start) {
  const int choice_index = static_cast<int>(index);
  if (!stream) {
    choice.text += delta.text;
    if (logprobs) {
      choice.logprobs.insert(choice.logprobs.end(), std::make_move_iterator(logprobs->begin()),
                             std::make_move_iterator(logprobs->end()));
    }
    return;
  }
  if (chat && delta.ended_before_resume) {
    // The first node sent every token and all the text (its parsers' tails included);
    // only the finish chunk was lost. The catch-up counted the tool calls.
    const bool called_tools = choice.tools && choice.tools->num_calls() > 0;
    write_event(
        chat_finish_chunk(meta, stream_options, choice_index, delta.finish_reason, called_tools));
  } else if (chat) {
    ReasoningDelta piece = choice.reasoning->push(delta.text);
    if (delta.finished) {
      ReasoningDelta tail = choice.reasoning->finish();
      piece.reasoning += tail.reasoning;
      piece.content += tail.content;
    }
    std::vector<ChatToolCallDelta> calls;
    if (choice.tools) {
      ToolCallDelta parsed = choice.tools->push(piece.content);
      if (delta.finished) parsed.content += choice.tools->finish().content;
      piece.content = std::move(parsed.content);
      calls = streamed_calls(choice_index, std::move(parsed.fragments));
    }
    // One event per delta, so that a resumable stream's checkpoint covers all of it.
    if (!piece.reasoning.empty() || !piece.content.empty() || !calls.empty() || logprobs) {
      write_event(chat_delta_chunk(meta, stream_options, choice_index, piece.reasoning,
                                   piece.content, logprobs ? &*logprobs : nullptr, calls));
    }
    if (delta.finished) {
      const bool called_tools = choice.tools && choice.tools->num_calls() > 0;
      write_event(chat_finish_chunk(meta, stream_options, choice_index, delta.finish_reason,
                                    called_tools, delta.matched_stop));
    }
  } else if (!delta.text.empty() || delta.finished || logprobs) {
    CompletionChoice chunk;
    chunk.index = choice_index;
    chunk.text = std::move(delta.text);
    chunk.logprobs = std::move(logprobs);
    chunk.text_offset_start = text_offset_start;
    chunk.finish_reason = delta.finished ? delta.finish_reason : FinishReason::kNone;
    write_event(completion_chunk(meta, stream_options, chunk));
  }
}

// A resumed stream's text so far, already delivered by the node that started it: the
// reasoning and tool-call parsers and the logprob offsets move past it, nothing is written.
void GenerationStream::catch_up(Choice& choice, const std::string& delivered_text) {
  if (choice.reasoning) {
    const ReasoningDelta replayed = choice.reasoning->push(delivered_text);
    if (choice.tools) choice.tools->push(replayed.content);
  }
  if (!want_logprobs) return;
  for (const int32_t token : choice.resumed_token_ids) {
    choice.logprob_text_offset += code_points(token_string(token));
  }
}

// Called with the mutex held, once every choice has finished.
nlohmann::ordered_json GenerationStream::timeline_json() {
  RequestTimelineInput input;
  input.request_id = meta.id;
  input.trace_id = trace_id;
  input.node = node;
  input.arrival = arrival;
  input.head_sent = head_sent_;
  input.token_times = std::move(first_choice_token_times_);
  std::ranges::sort(finished_choices_, {}, &ChoiceTimeline::index);
  input.choices = std::move(finished_choices_);
  return build_request_timeline(input).to_json();
}

void GenerationStream::finish() {
  if (!lifecycle_.finish()) return;
  Usage usage;
  for (const Choice& choice : choices) {
    if (choice.counts_prompt) usage.prompt_tokens += choice.prompt_tokens;
    usage.completion_tokens += choice.completion_tokens;
  }
  metrics.count_response(200);
  // A non-streamed answer's head goes out with its body, now.
  if (!stream) head_sent_ = std::chrono::steady_clock::now();
  if (stream) {
    if (stream_options.include_usage) {
      nlohmann::ordered_json chunk = usage_chunk(meta, chat, usage);
      if (wants_timeline) chunk["usage"][kTimelineUsageField] = timeline_json();
      channel_->write(to_sse(UsageEvent::of(std::move(chunk))));
    } else if (wants_timeline) {
      channel_->write(to_sse(TimelineEvent{timeline_json()}));
    }
    channel_->write(to_sse(DoneEvent{}));
    channel_->end_stream();
  } else if (chat) {
    std::vector<ChatChoice> out;
    for (size_t i = 0; i < choices.size(); ++i) {
      Choice& choice = choices[i];
      ReasoningSplit split = split_reasoning(choice.text, choice.starts_in_reasoning);
      std::vector<ChatToolCall> calls;
      if (choice.tools) {
        ToolCallDelta parsed = split_tool_calls(split.content);
        split.content = std::move(parsed.content);
        calls = numbered_calls(static_cast<int>(i), std::move(parsed.calls));
      }
      out.push_back({static_cast<int>(i), chat_echo + split.content, std::move(split.reasoning),
                     requested_logprobs(choice), choice.finish_reason, std::move(calls),
                     choice.matched_stop});
    }
    // One prompt: vLLM reports its prompt_logprobs once, beside the choices.
    nlohmann::ordered_json body =
        chat_completion_response(meta, out, usage, choices.front().prompt_logprobs);
    if (wants_timeline) body["usage"][kTimelineUsageField] = timeline_json();
    channel_->send(json_response(200, to_json_text(body)));
  } else {
    std::vector<CompletionChoice> out;
    for (size_t i = 0; i < choices.size(); ++i) {
      Choice& choice = choices[i];
      out.push_back({static_cast<int>(i), std::move(choice.text), requested_logprobs(choice), 0,
                     choice.finish_reason, std::move(choice.prompt_logprobs)});
    }
    nlohmann::ordered_json body = completion_response(meta, out, usage);
    if (wants_timeline) body["usage"][kTimelineUsageField] = timeline_json();
    channel_->send(json_response(200, to_json_text(body)));
  }
  channel_.reset();
}

// Call ids are made of the response id, the choice and the call's index: unique, and the same
// when another node resumes the stream.
std::string GenerationStream::call_id(int choice_index, int call_index) const {
  return "call_" + meta.id.substr(meta.id.find('-') + 1) + "_" + std::to_string(choice_index) +
         "_" + std::to_string(call_index);
}

std::vector<ChatToolCall> GenerationStream::numbered_calls(
    int choice_index, std::vector<ParsedToolCall> parsed) const {
  std::vector<ChatToolCall> calls;
  for (ParsedToolCall& call : parsed) {
    calls.push_back({call_id(choice_index, static_cast<int>(calls.size())), std::move(call.name),
                     std::move(call.arguments)});
  }
  return calls;
}

std::vector<ChatToolCallDelta> GenerationStream::streamed_calls(
    int choice_index, std::vector<ToolCallFragment> fragments) const {
  std::vector<ChatToolCallDelta> calls;
  for (ToolCallFragment& fragment : fragments) {
    ChatToolCallDelta& call = calls.emplace_back();
    call.index = fragment.index;
    if (fragment.name) {
      call.header = {call_id(choice_index, fragment.index), std::move(*fragment.name)};
    }
    call.arguments = std::move(fragment.arguments);
  }
  return calls;
}

std::optional<std::vector<OutputTokenLogprob>> GenerationStream::requested_logprobs(
    Choice& choice) const {
  if (!want_logprobs) return std::nullopt;
  return std::move(choice.logprobs);
}

}  // namespace pdserve
