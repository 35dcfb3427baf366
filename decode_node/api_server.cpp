#include "decode_node/api_server.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "common/core/log.h"
#include "common/http/api_error_response.h"
#include "common/http/service_routes.h"
#include "common/metrics/vllm_compat.h"
#include "common/protocol/chat_prompt.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_request.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/pdserve_headers.h"
#include "common/protocol/reasoning_parser.h"
#include "common/protocol/stream_resume.h"
#include "common/protocol/tool_call_parser.h"
#include "decode_node/request_timeline.h"

namespace pdserve {
namespace {

// pdserve's own phase histograms (seconds): finer than vLLM's request buckets at the low end,
// where a KV transfer or a remote prefill of a short prompt lies.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0};

// The finish reasons an engine request can end with (vLLM's request_success_total labels).
constexpr FinishReason kFinishReasons[] = {FinishReason::kStop, FinishReason::kLength};

http::HttpResponse json_response(int status, std::string body) {
  return {status, "application/json", {}, std::move(body)};
}

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

// One log line per request that had unknown top-level fields (vLLM logs them too).
void log_ignored_fields(const std::vector<std::string>& fields) {
  if (fields.empty()) return;
  std::string names;
  for (const std::string& field : fields) names += (names.empty() ? "" : ", ") + field;
  PDS_LOG_INFO("ignored request fields (--strict-request-fields refuses them): " + names);
}

// %XX escapes decoded; anything else (a lone '%' too) kept as is.
std::string percent_decoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

uint64_t random_id_prefix() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | device();
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One client request in flight: its choices, and how they reach the client.
struct ApiServer::Generation {
  struct Choice {
    std::string text;  // non-streaming: the echo prefix and everything generated
    std::vector<OutputTokenLogprob> logprobs;  // non-streaming, when requested
    int64_t logprob_text_offset = 0;           // code points of the token strings reported so far
    std::optional<SteadyTime> last_token_at;   // arrival of its previous delta with tokens
    FinishReason finish_reason = FinishReason::kNone;
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
  };

  ApiServer* server = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::shared_ptr<http::ResponseChannel> channel;  // reset once answered
  // The connection's strand, where deltas are handled (formatting, reasoning parsing,
  // metrics): the engine thread only hands them over.
  std::shared_ptr<http::ResponseChannel> strand;
  bool chat = false;
  bool stream = false;
  bool want_logprobs = false;
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
  bool over = false;  // answered or failed: later deltas are dropped
  // A stream's head normally goes out at once (clients see 200 while queued). A remotely
  // prefilled request's head waits for its first delta, so that a failure before any token
  // (the prefill node refused, the KV pool is full) is a plain HTTP error the proxy can act on.
  bool started = false;
  SteadyTime head_sent{};
  std::vector<SteadyTime> first_choice_token_times;
  std::vector<ChoiceTimeline> finished_choices;

  // Called with the mutex held. A resumable stream's choice events follow their checkpoint
  // (the usage chunk, of no choice, needs none). With continuous usage stats every choice
  // chunk carries its choice's usage so far (vLLM).
  void write_event(nlohmann::ordered_json payload) {
    if (resumable && payload["choices"].size() == 1) {
      write_checkpoint(payload["choices"][0]["index"].get<size_t>());
    }
    if (continuous_usage && payload["choices"].size() == 1) {
      const Choice& choice = choices[payload["choices"][0]["index"].get<size_t>()];
      payload["usage"] = {{"prompt_tokens", choice.prompt_length},
                          {"completion_tokens", choice.tokens_streamed},
                          {"total_tokens", choice.prompt_length + choice.tokens_streamed}};
    }
    channel->write(sse_event(payload));
  }

  void write_checkpoint(size_t index) {
    Choice& choice = choices[index];
    const StreamCheckpoint checkpoint{meta.id,
                                      meta.created,
                                      static_cast<int>(choices.size()),
                                      static_cast<int>(index),
                                      std::move(choice.unnamed_tokens),
                                      choice.sampler_state};
    channel->write(checkpoint.to_comment());
    choice.unnamed_tokens.clear();
  }

  void fail(const ApiError& error) {
    over = true;
    server->count_response(started ? 200 : error.http_status);
    if (started) {
      channel->write(sse_event(nlohmann::ordered_json::parse(error.body())));
      channel->write(sse_done());
      channel->end_stream();
    } else {
      channel->send(http::api_error_response(error));
    }
    channel.reset();
  }

  // Called with the mutex held, before any delta: a stream's head, then each chat choice's
  // role chunk or each completion choice's echoed prompt.
  void start() {
    started = stream;
    if (!stream) return;
    channel->start_stream(200, "text/event-stream", {});
    head_sent = std::chrono::steady_clock::now();
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
      } else if (!choices[i].text.empty()) {
        CompletionChoice echo;
        echo.index = index;
        echo.text = choices[i].text;
        write_event(completion_chunk(meta, stream_options, echo));
      }
    }
  }

  // The delta's logprobs with token strings; advances the choice's text offset past them.
  std::vector<OutputTokenLogprob> output_logprobs(const std::vector<SampledTokenLogprobs>& sampled,
                                                  Choice& choice) const {
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

  // An id the model can produce but the tokenizer does not know (a padding row of the
  // embedding) has no text: it is reported as "".
  std::string token_string(int32_t id) const {
    return std::string(tokenizer->token_bytes(id).value_or(std::string_view()));
  }

  // Handles one delta of choice `index`. Returns the engine requests to abort (after the
  // mutex is released) when this delta failed the whole generation: its siblings.
  std::vector<std::string> on_delta(size_t index, SequenceDelta delta, SteadyTime arrived) {
    std::lock_guard lock(mutex);
    if (over) return {};
    if (!started && (!delta.finished || delta.error.ok())) start();
    // For the timeline: a stream's tokens leave now, after its head; a whole answer's go out
    // with the body, the time they arrived stands for them.
    const SteadyTime handed_over = stream ? std::chrono::steady_clock::now() : arrived;
    Choice& choice = choices[index];
    choice.tokens_streamed += static_cast<int>(delta.token_ids.size());
    if (!delta.token_ids.empty()) {
      if (choice.last_token_at) {
        server->record_inter_token_latency(seconds_between(*choice.last_token_at, arrived));
      }
      choice.last_token_at = arrived;
      if (index == 0) {
        first_choice_token_times.insert(first_choice_token_times.end(), delta.token_ids.size(),
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
    const int choice_index = static_cast<int>(index);
    const int64_t text_offset_start = choice.logprob_text_offset;
    std::optional<std::vector<OutputTokenLogprob>> logprobs;
    if (want_logprobs && !delta.logprobs.empty()) {
      logprobs = output_logprobs(delta.logprobs, choice);
    }
    if (stream) {
      if (chat && delta.ended_before_resume) {
        // The first node sent every token and all the text (its parsers' tails included);
        // only the finish chunk was lost. The catch-up above counted the tool calls.
        const bool called_tools = choice.tools && choice.tools->num_calls() > 0;
        write_event(chat_finish_chunk(meta, stream_options, choice_index, delta.finish_reason,
                                      called_tools));
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
                                        called_tools));
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
    } else {
      choice.text += delta.text;
      if (logprobs) {
        choice.logprobs.insert(choice.logprobs.end(), std::make_move_iterator(logprobs->begin()),
                               std::make_move_iterator(logprobs->end()));
      }
    }
    if (!delta.finished) return {};

    choice.finish_reason = delta.finish_reason;
    choice.prompt_tokens = delta.prompt_tokens;
    choice.completion_tokens = delta.completion_tokens;
    finished_choices.push_back(
        {choice_index, delta.timings, delta.remote_prefill, delta.completion_tokens, handed_over});
    server->record_finished(delta);
    if (--remaining == 0) finish();
    return {};
  }

  // A resumed stream's text so far, already delivered by the node that started it: the
  // reasoning and tool-call parsers and the logprob offsets move past it, nothing is written.
  void catch_up(Choice& choice, const std::string& delivered_text) {
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
  nlohmann::ordered_json timeline_json() {
    RequestTimelineInput input;
    input.request_id = meta.id;
    input.trace_id = trace_id;
    input.node = node;
    input.arrival = arrival;
    input.head_sent = head_sent;
    input.token_times = std::move(first_choice_token_times);
    std::ranges::sort(finished_choices, {}, &ChoiceTimeline::index);
    input.choices = std::move(finished_choices);
    return build_request_timeline(input).to_json();
  }

  void finish() {
    over = true;
    Usage usage;
    for (const Choice& choice : choices) {
      if (choice.counts_prompt) usage.prompt_tokens += choice.prompt_tokens;
      usage.completion_tokens += choice.completion_tokens;
    }
    server->count_response(200);
    // A non-streamed answer's head goes out with its body, now.
    if (!stream) head_sent = std::chrono::steady_clock::now();
    if (stream) {
      if (stream_options.include_usage) {
        nlohmann::ordered_json chunk = usage_chunk(meta, chat, usage);
        if (wants_timeline) chunk["usage"][kTimelineUsageField] = timeline_json();
        write_event(chunk);
      } else if (wants_timeline) {
        channel->write(std::string(kTimelineCommentPrefix) + to_json_text(timeline_json()) +
                       "\n\n");
      }
      channel->write(sse_done());
      channel->end_stream();
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
                       requested_logprobs(choice), choice.finish_reason, std::move(calls)});
      }
      nlohmann::ordered_json body = chat_completion_response(meta, out, usage);
      if (wants_timeline) body["usage"][kTimelineUsageField] = timeline_json();
      channel->send(json_response(200, to_json_text(body)));
    } else {
      std::vector<CompletionChoice> out;
      for (size_t i = 0; i < choices.size(); ++i) {
        Choice& choice = choices[i];
        out.push_back({static_cast<int>(i), std::move(choice.text), requested_logprobs(choice), 0,
                       choice.finish_reason});
      }
      nlohmann::ordered_json body = completion_response(meta, out, usage);
      if (wants_timeline) body["usage"][kTimelineUsageField] = timeline_json();
      channel->send(json_response(200, to_json_text(body)));
    }
    channel.reset();
  }

  // Call ids are made of the response id, the choice and the call's index: unique, and the same
  // when another node resumes the stream.
  std::string call_id(int choice_index, int call_index) const {
    return "call_" + meta.id.substr(meta.id.find('-') + 1) + "_" + std::to_string(choice_index) +
           "_" + std::to_string(call_index);
  }

  std::vector<ChatToolCall> numbered_calls(int choice_index,
                                           std::vector<ParsedToolCall> parsed) const {
    std::vector<ChatToolCall> calls;
    for (ParsedToolCall& call : parsed) {
      calls.push_back({call_id(choice_index, static_cast<int>(calls.size())), std::move(call.name),
                       std::move(call.arguments)});
    }
    return calls;
  }

  std::vector<ChatToolCallDelta> streamed_calls(int choice_index,
                                                std::vector<ToolCallFragment> fragments) const {
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

  std::optional<std::vector<OutputTokenLogprob>> requested_logprobs(Choice& choice) const {
    if (!want_logprobs) return std::nullopt;
    return std::move(choice.logprobs);
  }
};

struct ApiServer::RequestSeries {
  RequestSeries(metrics::Registry& registry, const ModelInfo& model) {
    const metrics::Labels labels = metrics::vllm_labels(model.name);
    const auto histogram = [&registry](const char* name, const char* help,
                                       const std::vector<double>& buckets,
                                       const metrics::Labels& with) {
      return &registry.histogram(name, help, buckets, with);
    };
    const auto& request_buckets = metrics::vllm_request_latency_buckets();
    const auto& token_buckets = metrics::vllm_token_latency_buckets();
    const std::vector<double> length_buckets = metrics::vllm_1_2_5_buckets(model.max_model_len);
    ttft = histogram("vllm:time_to_first_token_seconds",
                     "Histogram of time to first token in seconds.", metrics::vllm_ttft_buckets(),
                     labels);
    inter_token = histogram("vllm:inter_token_latency_seconds",
                            "Histogram of inter-token latency in seconds.", token_buckets, labels);
    inter_token_deprecated = histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds. DEPRECATED in vLLM 0.11: the same "
        "observations as vllm:inter_token_latency_seconds.",
        token_buckets, labels);
    request_tpot =
        histogram("vllm:request_time_per_output_token_seconds",
                  "Histogram of time_per_output_token_seconds per request.", token_buckets, labels);
    e2e = histogram("vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.", request_buckets, labels);
    queue =
        histogram("vllm:request_queue_time_seconds",
                  "Histogram of time spent in WAITING phase for request.", request_buckets, labels);
    prefill = histogram("vllm:request_prefill_time_seconds",
                        "Histogram of time spent in PREFILL phase for request (prefilled here).",
                        request_buckets, labels);
    decode =
        histogram("vllm:request_decode_time_seconds",
                  "Histogram of time spent in DECODE phase for request.", request_buckets, labels);
    inference =
        histogram("vllm:request_inference_time_seconds",
                  "Histogram of time spent in RUNNING phase for request.", request_buckets, labels);
    prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                              length_buckets, labels);
    generation_tokens = histogram("vllm:request_generation_tokens",
                                  "Number of generation tokens processed.", length_buckets, labels);
    for (const FinishReason reason : kFinishReasons) {
      metrics::Labels with_reason = labels;
      with_reason.emplace_back("finished_reason", std::string(finish_reason_name(reason)));
      success[static_cast<size_t>(reason)] = &registry.counter(
          "vllm:request_success_total", "Count of successfully processed requests.", with_reason);
    }
    remote_prefill = histogram("pdserve:remote_prefill_time_seconds",
                               "Prefill work posted to a prefill node to its first token received.",
                               kPhaseBuckets, {});
    kv_wait = histogram("pdserve:kv_wait_time_seconds",
                        "First token received from the prefill node to its KV landed here.",
                        kPhaseBuckets, {});
    kv_transfer =
        histogram("pdserve:kv_transfer_time_seconds",
                  "KV transfer as the prefill node measured it (first put to acknowledgement).",
                  kPhaseBuckets, {});
    kv_transfer_bytes = &registry.counter("pdserve:kv_transfer_bytes_total",
                                          "KV bytes received from prefill nodes.");
  }

  metrics::Histogram* ttft;
  metrics::Histogram* inter_token;
  metrics::Histogram* inter_token_deprecated;
  metrics::Histogram* request_tpot;
  metrics::Histogram* e2e;
  metrics::Histogram* queue;
  metrics::Histogram* prefill;
  metrics::Histogram* decode;
  metrics::Histogram* inference;
  metrics::Histogram* prompt_tokens;
  metrics::Histogram* generation_tokens;
  // By FinishReason; kNone's slot stays null (a finished request always has a reason).
  std::array<metrics::Counter*, std::size(kFinishReasons) + 1> success{};
  metrics::Histogram* remote_prefill;
  metrics::Histogram* kv_wait;
  metrics::Histogram* kv_transfer;
  metrics::Counter* kv_transfer_bytes;
};

ApiServer::ApiServer(InferenceService& service, const Tokenizer& tokenizer,
                     const ChatTemplate& chat_template, ApiOptions options)
    : service_(service),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(options),
      series_(std::make_unique<RequestSeries>(metrics_, service.model_info())),
      // Counters start at the engine's totals now: the warm-up's tokens are not traffic.
      engine_metrics_(metrics_, service.model_info().name, NodeRole::kDecode, service.stats()),
      id_prefix_(random_id_prefix()) {}

ApiServer::~ApiServer() = default;

void ApiServer::register_routes(http::Router& router) {
  const AccessPolicy& access = options_.access;
  router.add(
      "POST", "/v1/completions",
      guarded(access, RouteAccess::kClient,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                handle_generation(request, ch, false);
              }));
  router.add(
      "POST", "/v1/chat/completions",
      guarded(access, RouteAccess::kClient,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                handle_generation(request, ch, true);
              }));
  router.add("GET", "/v1/models",
             guarded(access, RouteAccess::kClient,
                     [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                       handle_models(ch);
                     }));
  router.add_prefix(
      "GET", "/v1/models/",
      guarded(access, RouteAccess::kClient,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                handle_model(request, ch);
              }));
  router.add(
      "POST", "/tokenize",
      guarded(access, RouteAccess::kClient,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                handle_tokenize(request, ch);
              }));
  router.add(
      "POST", "/detokenize",
      guarded(access, RouteAccess::kClient,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                handle_detokenize(request, ch);
              }));
  // The port opens only once the model is loaded and the engine runs: serving is ready.
  http::add_service_routes(router, {}, [this](int status) { count_response(status); });
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_metrics(ch);
             });
}

void ApiServer::reply_error(http::ResponseChannel& channel, const ApiError& error) {
  count_response(error.http_status);
  channel.send(http::api_error_response(error));
}

void ApiServer::count_response(int status) {
  metrics_
      .counter("pdserve:http_requests_total", "HTTP responses by status code.",
               {{"status", std::to_string(status)}})
      .inc();
}

void ApiServer::record_finished(const SequenceDelta& delta) {
  if (metrics::Counter* success = series_->success[static_cast<size_t>(delta.finish_reason)]) {
    success->inc();
  }
  const RequestTimings& timings = delta.timings;
  if (timings.first_scheduled) {
    series_->queue->observe(seconds_between(timings.arrival, *timings.first_scheduled));
  }
  if (timings.first_token) {
    series_->ttft->observe(seconds_between(timings.arrival, *timings.first_token));
  }
  if (!timings.finished) return;
  record_phases(delta);
  series_->prompt_tokens->observe(static_cast<double>(delta.prompt_tokens));
  series_->generation_tokens->observe(static_cast<double>(delta.completion_tokens));
  const double e2e = seconds_between(timings.arrival, *timings.finished);
  series_->e2e->observe(e2e);
  std::optional<double> ttft;
  std::optional<double> tpot;
  if (timings.first_token) ttft = seconds_between(timings.arrival, *timings.first_token);
  if (ttft && delta.completion_tokens > 1) {
    tpot = (e2e - *ttft) / (delta.completion_tokens - 1);
    series_->request_tpot->observe(*tpot);
  }
  log_finished(delta, ttft, tpot, e2e);
}

void ApiServer::log_finished(const SequenceDelta& delta, std::optional<double> ttft_seconds,
                             std::optional<double> tpot_seconds, double e2e_seconds) const {
  const auto ms = [](std::optional<double> seconds) {
    return seconds ? std::to_string(static_cast<int64_t>(*seconds * 1000.0)) + " ms"
                   : std::string("-");
  };
  PDS_LOG_INFO("request " + delta.request_id + " finished (" +
               std::string(finish_reason_name(delta.finish_reason)) + "): prompt " +
               std::to_string(delta.prompt_tokens) + " tokens, output " +
               std::to_string(delta.completion_tokens) + " tokens, TTFT " + ms(ttft_seconds) +
               ", TPOT " + ms(tpot_seconds) + ", e2e " + ms(e2e_seconds));
}

void ApiServer::record_phases(const SequenceDelta& delta) {
  const RequestTimings& timings = delta.timings;
  // Where the work on the prompt started: the prefill work's POST, or the local schedule.
  std::optional<SteadyTime> inference_start = timings.first_scheduled;
  if (delta.remote_prefill && delta.remote_prefill->work_posted != SteadyTime{}) {
    const RemotePrefillStats& remote = *delta.remote_prefill;
    inference_start = remote.work_posted;
    series_->remote_prefill->observe(
        seconds_between(remote.work_posted, remote.first_token_received));
    // A request ended by its first token does not wait for its KV.
    if (timings.kv_ready) {
      series_->kv_wait->observe(seconds_between(remote.first_token_received, *timings.kv_ready));
      series_->kv_transfer->observe(remote.transfer_seconds);
      series_->kv_transfer_bytes->inc(static_cast<double>(remote.transfer_bytes));
    }
  } else if (timings.first_scheduled && timings.first_token) {
    // A remote prefill is counted by the prefill node that did it, so that a sum over all
    // nodes counts every request's prefill once.
    series_->prefill->observe(seconds_between(*timings.first_scheduled, *timings.first_token));
  }
  if (timings.first_token) {
    series_->decode->observe(seconds_between(*timings.first_token, *timings.finished));
  }
  if (inference_start) {
    series_->inference->observe(seconds_between(*inference_start, *timings.finished));
  }
}

void ApiServer::record_inter_token_latency(double seconds) {
  series_->inter_token->observe(seconds);
  series_->inter_token_deprecated->observe(seconds);
}

void ApiServer::abort_requests(const std::vector<std::string>& engine_ids) {
  for (const std::string& engine_id : engine_ids) service_.abort(engine_id);
}

nlohmann::ordered_json ApiServer::model_card() const {
  const ModelInfo& model = service_.model_info();
  nlohmann::ordered_json card;
  card["id"] = model.name;
  card["object"] = "model";
  card["created"] = unix_seconds();
  card["owned_by"] = "pdserve";
  card["max_model_len"] = model.max_model_len;
  return card;
}

void ApiServer::handle_models(const std::shared_ptr<http::ResponseChannel>& channel) {
  nlohmann::ordered_json body;
  body["object"] = "list";
  body["data"] = nlohmann::ordered_json::array({model_card()});
  count_response(200);
  channel->send(json_response(200, to_json_text(body)));
}

void ApiServer::handle_model(const http::HttpRequest& request,
                             const std::shared_ptr<http::ResponseChannel>& channel) {
  // The id may hold a slash ("Qwen/Qwen3-0.6B"), sent as is or percent-encoded.
  const std::string id = percent_decoded(
      std::string_view(request.path).substr(std::string_view("/v1/models/").size()));
  if (id != service_.model_info().name) return reply_error(*channel, model_not_found(id));
  count_response(200);
  channel->send(json_response(200, to_json_text(model_card())));
}

void ApiServer::handle_tokenize(const http::HttpRequest& request,
                                const std::shared_ptr<http::ResponseChannel>& channel) {
  const auto reject = [&](const ApiError& error) { reply_error(*channel, error); };
  const ModelInfo& model = service_.model_info();
  ApiResult<nlohmann::ordered_json> body = parse_json_body(request.body);
  if (!body.ok()) return reject(body.error());
  ApiResult<TokenizeRequest> parsed =
      parse_tokenize_request(body.value(), model.vocab_size, options_.strict_request_fields);
  if (!parsed.ok()) return reject(parsed.error());
  const TokenizeRequest& req = parsed.value();
  log_ignored_fields(req.ignored_fields);
  if (!req.model.empty() && req.model != model.name) return reject(model_not_found(req.model));
  std::string text;
  if (req.prompt) {
    text = *req.prompt;
  } else {
    ApiResult<std::string> rendered = render_chat_prompt(req.chat, chat_template_);
    if (!rendered.ok()) return reject(rendered.error());
    text = std::move(rendered).value();
  }
  Result<std::vector<int32_t>> tokens = tokenizer_.encode(text);
  if (!tokens.ok()) {
    return reject(invalid_request(tokens.status().message(), req.prompt ? "prompt" : "messages"));
  }
  nlohmann::ordered_json out;
  out["count"] = tokens->size();
  out["max_model_len"] = model.max_model_len;
  out["tokens"] = *tokens;
  out["token_strs"] = nullptr;
  if (req.return_token_strs) {
    out["token_strs"] = nlohmann::ordered_json::array();
    for (const int32_t id : *tokens)
      out["token_strs"].push_back(tokenizer_.id_to_token(id).value_or(""));
  }
  count_response(200);
  channel->send(json_response(200, to_json_text(out)));
}

void ApiServer::handle_detokenize(const http::HttpRequest& request,
                                  const std::shared_ptr<http::ResponseChannel>& channel) {
  const auto reject = [&](const ApiError& error) { reply_error(*channel, error); };
  const ModelInfo& model = service_.model_info();
  ApiResult<nlohmann::ordered_json> body = parse_json_body(request.body);
  if (!body.ok()) return reject(body.error());
  ApiResult<DetokenizeRequest> parsed =
      parse_detokenize_request(body.value(), model.vocab_size, options_.strict_request_fields);
  if (!parsed.ok()) return reject(parsed.error());
  log_ignored_fields(parsed.value().ignored_fields);
  if (!parsed.value().model.empty() && parsed.value().model != model.name) {
    return reject(model_not_found(parsed.value().model));
  }
  Result<std::string> text = tokenizer_.decode(parsed.value().tokens);
  if (!text.ok()) return reject(invalid_request(text.status().message(), "tokens"));
  count_response(200);
  channel->send(json_response(200, to_json_text(nlohmann::ordered_json{{"prompt", *text}})));
}

void ApiServer::handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel) {
  engine_metrics_.publish(service_.stats(), options_.draining && options_.draining());
  count_response(200);
  channel->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
}

void ApiServer::handle_generation(const http::HttpRequest& request,
                                  const std::shared_ptr<http::ResponseChannel>& channel,
                                  bool chat) {
  const SteadyTime arrival = std::chrono::steady_clock::now();
  const auto reject = [&](const ApiError& error) { reply_error(*channel, error); };
  const ModelInfo& model = service_.model_info();
  ApiResult<nlohmann::ordered_json> body = parse_json_body(request.body);
  if (!body.ok()) return reject(body.error());
  // The proxy's resumption of a stream (common/protocol/stream_resume.h) is no OpenAI field.
  std::optional<nlohmann::json> resume_field;
  if (const auto field = body.value().find(kStreamResumeField); field != body.value().end()) {
    if (!cluster_token_matches(request, options_.access.cluster_token)) {
      return reject(unauthorized(std::string(kStreamResumeField) + " needs the cluster token"));
    }
    resume_field = nlohmann::json::parse(field->dump());
    body.value().erase(field);
  }
  // Test only: the output's first tokens (ApiOptions::test_scripted_output).
  std::vector<int32_t> scripted_output;
  if (const auto field = body.value().find("pdserve_test_output");
      options_.test_scripted_output && field != body.value().end()) {
    if (!field->is_string()) {
      return reject(invalid_request("pdserve_test_output must be a string", "pdserve_test_output"));
    }
    Result<std::vector<int32_t>> ids = tokenizer_.encode(field->get<std::string>());
    if (!ids.ok()) return reject(invalid_request(ids.status().message(), "pdserve_test_output"));
    scripted_output = std::move(ids).value();
    body.value().erase(field);
  }
  const bool strict = options_.strict_request_fields;
  ApiResult<GenerationRequest> parsed =
      chat ? parse_chat_completion_request(body.value(), model.vocab_size, strict)
           : parse_completion_request(body.value(), model.vocab_size, strict);
  if (!parsed.ok()) return reject(parsed.error());
  GenerationRequest& req = parsed.value();
  log_ignored_fields(req.ignored_fields);
  if (!req.model.empty() && req.model != model.name) return reject(model_not_found(req.model));
  if (!chat && req.echo && req.sampling.want_logprobs) {
    return reject(invalid_request(
        "echo with logprobs is not supported: this server does not compute prompt logprobs.",
        "echo"));
  }

  // One prompt per entry: its tokens, echo text and whether output starts inside <think>.
  struct PreparedPrompt {
    std::vector<int32_t> tokens;
    std::string echo;
    bool starts_in_reasoning = false;
  };
  std::vector<PreparedPrompt> prompts;
  if (chat) {
    ApiResult<std::string> text = render_chat_prompt(req, chat_template_);
    if (!text.ok()) return reject(text.error());
    Result<std::vector<int32_t>> tokens = tokenizer_.encode(text.value());
    if (!tokens.ok()) return reject(api_error_from_status(tokens.status()));
    prompts.push_back({std::move(tokens).value(), "", prompt_ends_in_reasoning(text.value())});
  } else {
    for (const Prompt& prompt : req.prompts) {
      PreparedPrompt prepared;
      if (prompt.is_token_ids) {
        prepared.tokens = prompt.token_ids;
        if (req.echo) {
          Result<std::string> text = tokenizer_.decode(prompt.token_ids, false);
          if (!text.ok()) return reject(invalid_request(text.status().message(), "prompt"));
          prepared.echo = std::move(text).value();
        }
      } else {
        Result<std::vector<int32_t>> tokens = tokenizer_.encode(prompt.text);
        if (!tokens.ok()) return reject(invalid_request(tokens.status().message(), "prompt"));
        prepared.tokens = std::move(tokens).value();
        prepared.echo = req.echo ? prompt.text : "";
      }
      if (prepared.tokens.empty()) return reject(invalid_request("The prompt is empty.", "prompt"));
      prompts.push_back(std::move(prepared));
    }
  }

  // Stream resumption (common/protocol/stream_resume.h): between the proxy and its nodes only,
  // for streams (any number of choices).
  const size_t num_choices = prompts.size() * static_cast<size_t>(req.n);
  std::optional<StreamResume> resume;
  if (resume_field) {
    if (!req.stream) {
      return reject(invalid_request(
          std::string(kStreamResumeField) + " continues a streamed request", kStreamResumeField));
    }
    Result<StreamResume> parsed_resume = StreamResume::parse(*resume_field);
    if (!parsed_resume.ok()) {
      return reject(invalid_request(parsed_resume.status().message(), kStreamResumeField));
    }
    resume = std::move(parsed_resume).value();
    if (resume->choices.size() != num_choices) {
      return reject(invalid_request(std::string(kStreamResumeField) + " has " +
                                        std::to_string(resume->choices.size()) +
                                        " choices; the request has " +
                                        std::to_string(num_choices),
                                    kStreamResumeField));
    }
    if (std::ranges::all_of(resume->choices, &ResumedChoice::finished)) {
      return reject(invalid_request(
          std::string(kStreamResumeField) + ": every choice has finished; nothing is left",
          kStreamResumeField));
    }
  }
  const bool resumable = req.stream && request.header(kResumableHeader) == "1" &&
                         cluster_token_matches(request, options_.access.cluster_token);

  auto generation = std::make_shared<Generation>();
  generation->server = this;
  generation->tokenizer = &tokenizer_;
  generation->channel = channel;
  generation->strand = channel;
  generation->chat = chat;
  // vLLM echoes the last message when it has the answer's role: assistant, or any role when no
  // generation prompt opens a new turn.
  if (chat && req.echo &&
      (!req.add_generation_prompt || req.messages.back()["role"] == "assistant")) {
    generation->chat_echo = req.messages.back()["content"].get<std::string>();
  }
  generation->stream = req.stream;
  generation->want_logprobs = req.sampling.want_logprobs;
  generation->stream_options.include_usage = req.include_usage;
  generation->continuous_usage = req.include_usage && req.continuous_usage_stats;
  generation->arrival = arrival;
  const http::TraceContext trace = trace_ids_.context_for(request.header(kTraceparentHeader));
  generation->trace_id = trace.trace_id;
  generation->node = "decode http://" + std::string(request.header("Host").value_or("unknown"));
  generation->wants_timeline = timeline_requested(request.header(kTimelineHeader));
  char id[40];
  std::snprintf(id, sizeof(id), "%016llx%016llx", static_cast<unsigned long long>(id_prefix_),
                static_cast<unsigned long long>(++next_id_));
  generation->meta = {(chat ? "chatcmpl-" : "cmpl-") + std::string(id), unix_seconds(), model.name};
  if (resume) {
    generation->meta.id = resume->id;
    generation->meta.created = resume->created;
    generation->resumed = true;
  }
  generation->resumable = resumable;

  std::vector<InferenceRequest> requests;
  std::vector<size_t> request_choices;  // a resumed stream's finished choices have no request
  for (const PreparedPrompt& prompt : prompts) {
    ApiResult<int> max_tokens =
        resolve_max_tokens(req, static_cast<int>(prompt.tokens.size()), model.max_model_len);
    if (!max_tokens.ok()) return reject(max_tokens.error());
    ApiResult<SamplingParams> sampling =
        req.resolved_sampling(model.generation_defaults, max_tokens.value(), model.vocab_size);
    if (!sampling.ok()) return reject(sampling.error());
    sampling.value().scripted_output = scripted_output;
    for (int sample = 0; sample < req.n; ++sample) {
      const size_t choice_index = generation->choices.size();
      const ResumedChoice* resumed = resume ? &resume->choices[choice_index] : nullptr;
      Generation::Choice choice;
      choice.counts_prompt = sample == 0;
      choice.prompt_length = static_cast<int>(prompt.tokens.size());
      choice.text = prompt.echo;
      choice.starts_in_reasoning = prompt.starts_in_reasoning;
      if (chat) choice.reasoning.emplace(prompt.starts_in_reasoning);
      if (chat && req.parses_tool_calls()) choice.tools.emplace();
      if (resumed) {
        choice.resumed_token_ids = resumed->output_token_ids;
        choice.tokens_streamed = static_cast<int>(resumed->output_token_ids.size());
        choice.sampler_state = resumed->sampler_state;
      }
      if (resumed && resumed->finished) {
        // The client has all of it; it only counts in the usage.
        choice.prompt_tokens = choice.prompt_length;
        choice.completion_tokens = choice.tokens_streamed;
        generation->choices.push_back(std::move(choice));
        continue;
      }
      generation->choices.push_back(std::move(choice));
      InferenceRequest engine_request;
      // Unique on this node: a resumed stream keeps its response id, and a late abort meant
      // for an earlier attempt (or a second resumption here) must not reach this one.
      engine_request.id = (resume ? generation->meta.id + "." + id : generation->meta.id) + "-" +
                          std::to_string(choice_index);
      engine_request.prompt_tokens = prompt.tokens;
      engine_request.sampling = sampling.value();
      // vLLM's parallel sampling: choice i of a seeded request draws with seed + i, so that
      // the n answers differ and each equals an n = 1 request with that seed.
      if (engine_request.sampling.seed) *engine_request.sampling.seed += sample;
      engine_request.stop = req.stop;
      engine_request.include_stop_str_in_output = req.include_stop_str_in_output;
      engine_request.skip_special_tokens = req.skip_special_tokens;
      engine_request.report_sampler_state = resumable;
      if (resumed && !resumed->output_token_ids.empty()) {
        // Prompt + the delivered tokens: prefilled by a prefill node too (the hook decides).
        engine_request.resume = ResumedOutput{resumed->output_token_ids, *resumed->sampler_state};
      }
      if (request_hook_) {
        const Status hooked = request_hook_(request, engine_request);
        if (!hooked.ok()) return reject(api_error_from_status(hooked));
      }
      if (engine_request.kv_import) engine_request.kv_import->traceparent = trace.traceparent();
      requests.push_back(std::move(engine_request));
      request_choices.push_back(choice_index);
    }
  }
  generation->remaining = requests.size();

  const bool remote_prefill = std::ranges::any_of(
      requests, [](const InferenceRequest& r) { return r.kv_import.has_value(); });
  std::vector<std::string> submitted_before_failure;
  std::optional<ApiError> submit_error;
  {
    // Held while submitting so no delta is handled before the stream head and the role chunks,
    // and engine_ids is complete when a failing delta looks up its siblings. Aborts happen
    // after it is released, so a service that answers an abort at once cannot deadlock here.
    std::lock_guard lock(generation->mutex);
    for (size_t i = 0; i < requests.size(); ++i) {
      std::string engine_id = requests[i].id;
      const size_t choice = request_choices[i];
      Status status =
          service_.submit(std::move(requests[i]), [this, generation, choice](SequenceDelta delta) {
            // On the engine thread: a timestamp and a hand-over, nothing that can wait.
            const SteadyTime arrived = std::chrono::steady_clock::now();
            generation->strand->post(
                [this, generation, choice, delta = std::move(delta), arrived]() mutable {
                  abort_requests(generation->on_delta(choice, std::move(delta), arrived));
                });
          });
      if (!status.ok()) {
        generation->over = true;
        generation->channel.reset();
        submitted_before_failure = generation->engine_ids;
        submit_error = api_error_from_status(status);
        break;
      }
      generation->engine_ids.push_back(std::move(engine_id));
      generation->engine_choices.push_back(choice);
    }
    if (!submit_error && !remote_prefill) generation->start();
  }
  if (submit_error) {
    abort_requests(submitted_before_failure);
    return reject(*submit_error);
  }
  channel->on_cancel([weak = std::weak_ptr<Generation>(generation), this] {
    if (auto gen = weak.lock()) abort_requests(gen->engine_ids);
  });
}

}  // namespace pdserve
