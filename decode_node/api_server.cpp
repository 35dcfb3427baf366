#include "decode_node/api_server.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "common/protocol/chat_prompt.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_request.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/reasoning_parser.h"
#include "decode_node/engine_bridge.h"

namespace pdserve {
namespace {

const std::vector<double> kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                             0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                             7.5,   10.0,  20.0, 40.0, 80.0, 160.0};

http::HttpResponse json_response(int status, std::string body) {
  return {status, "application/json", {}, std::move(body)};
}

http::HttpResponse error_response(const ApiError& error) {
  http::HttpResponse response = json_response(error.http_status, error.body());
  if (error.retry_after_seconds) {
    response.headers.emplace_back("Retry-After", std::to_string(*error.retry_after_seconds));
  }
  return response;
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
    FinishReason finish_reason = FinishReason::kNone;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    bool counts_prompt = false;  // the first choice of its prompt carries the prompt usage
    std::optional<ReasoningParser> reasoning;
    bool starts_in_reasoning = false;
  };

  ApiServer* server = nullptr;
  std::shared_ptr<http::ResponseChannel> channel;
  bool chat = false;
  bool stream = false;
  ResponseMeta meta;
  StreamOptions stream_options;
  std::vector<std::string> engine_ids;

  std::mutex mutex;
  std::vector<Choice> choices;
  size_t remaining = 0;
  bool over = false;  // answered or failed: later deltas are dropped

  // Called with the mutex held.
  void write_event(const nlohmann::ordered_json& payload) { channel->write(sse_event(payload)); }

  void fail(const ApiError& error) {
    over = true;
    server->count_response(stream ? 200 : error.http_status);
    if (stream) {
      channel->write(sse_event(nlohmann::ordered_json::parse(error.body())));
      channel->write(sse_done());
      channel->end_stream();
    } else {
      channel->send(error_response(error));
    }
    channel.reset();
  }

  void on_delta(size_t index, EngineDelta delta) {
    std::lock_guard lock(mutex);
    if (over) return;
    if (delta.finished && !delta.error.ok()) {
      fail(api_error_from_status(delta.error));
      return;
    }
    Choice& choice = choices[index];
    const int choice_index = static_cast<int>(index);
    if (stream) {
      if (chat) {
        ReasoningDelta piece = choice.reasoning->push(delta.text);
        if (delta.finished) {
          ReasoningDelta tail = choice.reasoning->finish();
          piece.reasoning += tail.reasoning;
          piece.content += tail.content;
        }
        if (!piece.reasoning.empty() || !piece.content.empty()) {
          write_event(chat_delta_chunk(meta, stream_options, choice_index, piece.reasoning,
                                       piece.content, nullptr));
        }
        if (delta.finished) {
          write_event(chat_finish_chunk(meta, stream_options, choice_index, delta.finish_reason));
        }
      } else if (!delta.text.empty() || delta.finished) {
        CompletionChoice chunk;
        chunk.index = choice_index;
        chunk.text = delta.text;
        chunk.finish_reason = delta.finished ? delta.finish_reason : FinishReason::kNone;
        write_event(completion_chunk(meta, stream_options, chunk));
      }
    } else {
      choice.text += delta.text;
    }
    if (!delta.finished) return;

    choice.finish_reason = delta.finish_reason;
    choice.prompt_tokens = delta.prompt_tokens;
    choice.completion_tokens = delta.completion_tokens;
    server->record_finished(delta);
    if (--remaining == 0) finish();
  }

  void finish() {
    over = true;
    Usage usage;
    for (const Choice& choice : choices) {
      if (choice.counts_prompt) usage.prompt_tokens += choice.prompt_tokens;
      usage.completion_tokens += choice.completion_tokens;
    }
    server->count_response(200);
    if (stream) {
      if (stream_options.include_usage) write_event(usage_chunk(meta, chat, usage));
      channel->write(sse_done());
      channel->end_stream();
    } else if (chat) {
      std::vector<ChatChoice> out;
      for (size_t i = 0; i < choices.size(); ++i) {
        ReasoningSplit split = split_reasoning(choices[i].text, choices[i].starts_in_reasoning);
        out.push_back({static_cast<int>(i), std::move(split.content), std::move(split.reasoning),
                       std::nullopt, choices[i].finish_reason});
      }
      channel->send(json_response(200, to_json_text(chat_completion_response(meta, out, usage))));
    } else {
      std::vector<CompletionChoice> out;
      for (size_t i = 0; i < choices.size(); ++i) {
        out.push_back({static_cast<int>(i), std::move(choices[i].text), std::nullopt, 0,
                       choices[i].finish_reason});
      }
      channel->send(json_response(200, to_json_text(completion_response(meta, out, usage))));
    }
    channel.reset();
  }
};

ApiServer::ApiServer(InferenceService& service, const Tokenizer& tokenizer,
                     const ChatTemplate& chat_template)
    : service_(service), tokenizer_(tokenizer), chat_template_(chat_template) {}

void ApiServer::register_routes(http::Router& router) {
  router.add("POST", "/v1/completions",
             [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
               handle_generation(request, ch, false);
             });
  router.add("POST", "/v1/chat/completions",
             [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
               handle_generation(request, ch, true);
             });
  router.add("GET", "/v1/models",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_models(ch);
             });
  router.add("GET", "/health",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               count_response(200);
               ch->send({200, "application/json", {}, "{}"});
             });
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_metrics(ch);
             });
}

void ApiServer::count_response(int status) {
  metrics_
      .counter("pdserve:http_requests_total", "HTTP responses by status code.",
               {{"status", std::to_string(status)}})
      .inc();
}

void ApiServer::record_finished(const EngineDelta& delta) {
  metrics_
      .counter("pdserve:request_success_total", "Requests finished, by finish reason.",
               {{"finished_reason", std::string(finish_reason_name(delta.finish_reason))}})
      .inc();
  if (delta.time_to_first_token_s >= 0) {
    metrics_
        .histogram("pdserve:time_to_first_token_seconds", "Time to the first token.",
                   kLatencyBuckets)
        .observe(delta.time_to_first_token_s);
  }
  if (delta.e2e_latency_s >= 0) {
    metrics_
        .histogram("pdserve:e2e_request_latency_seconds", "Arrival to the last token.",
                   kLatencyBuckets)
        .observe(delta.e2e_latency_s);
    if (delta.time_to_first_token_s >= 0 && delta.completion_tokens > 1) {
      metrics_
          .histogram("pdserve:time_per_output_token_seconds",
                     "Mean time per output token after the first.", kLatencyBuckets)
          .observe((delta.e2e_latency_s - delta.time_to_first_token_s) /
                   (delta.completion_tokens - 1));
    }
  }
}

void ApiServer::handle_models(const std::shared_ptr<http::ResponseChannel>& channel) {
  const EngineModel model = engine_model(service_);
  nlohmann::ordered_json card;
  card["id"] = model.name;
  card["object"] = "model";
  card["created"] = unix_seconds();
  card["owned_by"] = "pdserve";
  card["max_model_len"] = model.max_model_len;
  nlohmann::ordered_json body;
  body["object"] = "list";
  body["data"] = nlohmann::ordered_json::array({card});
  count_response(200);
  channel->send(json_response(200, to_json_text(body)));
}

void ApiServer::handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel) {
  const EngineLoad load = engine_load(service_);
  metrics_.gauge("pdserve:num_requests_running", "Sequences in the running batch.")
      .set(load.num_running);
  metrics_.gauge("pdserve:num_requests_waiting", "Sequences waiting to be scheduled.")
      .set(load.num_waiting);
  metrics_.gauge("pdserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).")
      .set(load.kv_usage);
  metrics_.gauge("pdserve:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
      .set(static_cast<double>(load.prefix_cache_queries));
  metrics_.gauge("pdserve:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
      .set(static_cast<double>(load.prefix_cache_hits));
  metrics_.gauge("pdserve:prompt_tokens_total", "Prompt tokens processed.")
      .set(static_cast<double>(load.prompt_tokens_total));
  metrics_.gauge("pdserve:generation_tokens_total", "Tokens generated.")
      .set(static_cast<double>(load.generation_tokens_total));
  count_response(200);
  channel->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
}

void ApiServer::handle_generation(const http::HttpRequest& request,
                                  const std::shared_ptr<http::ResponseChannel>& channel,
                                  bool chat) {
  const auto reject = [&](const ApiError& error) {
    count_response(error.http_status);
    channel->send(error_response(error));
  };
  const EngineModel model = engine_model(service_);
  ApiResult<nlohmann::ordered_json> body = parse_json_body(request.body);
  if (!body.ok()) return reject(body.error());
  ApiResult<GenerationRequest> parsed =
      chat ? parse_chat_completion_request(body.value(), model.vocab_size)
           : parse_completion_request(body.value(), model.vocab_size);
  if (!parsed.ok()) return reject(parsed.error());
  GenerationRequest& req = parsed.value();
  if (!req.model.empty() && req.model != model.name) return reject(model_not_found(req.model));

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

  auto generation = std::make_shared<Generation>();
  generation->server = this;
  generation->channel = channel;
  generation->chat = chat;
  generation->stream = req.stream;
  generation->stream_options.include_usage = req.include_usage;
  char id[32];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(++next_id_));
  generation->meta = {(chat ? "chatcmpl-" : "cmpl-") + std::string(id), unix_seconds(), model.name};

  std::vector<EngineSubmission> submissions;
  for (const PreparedPrompt& prompt : prompts) {
    ApiResult<int> max_tokens =
        resolve_max_tokens(req, static_cast<int>(prompt.tokens.size()), model.max_model_len);
    if (!max_tokens.ok()) return reject(max_tokens.error());
    ApiResult<SamplingParams> sampling =
        req.resolved_sampling(model.generation_defaults, max_tokens.value(), model.vocab_size);
    if (!sampling.ok()) return reject(sampling.error());
    for (int sample = 0; sample < req.n; ++sample) {
      Generation::Choice choice;
      choice.counts_prompt = sample == 0;
      choice.text = prompt.echo;
      choice.starts_in_reasoning = prompt.starts_in_reasoning;
      if (chat) choice.reasoning.emplace(prompt.starts_in_reasoning);
      generation->choices.push_back(std::move(choice));
      EngineSubmission submission;
      submission.id = generation->meta.id + "-" + std::to_string(submissions.size());
      submission.prompt_tokens = prompt.tokens;
      submission.sampling = sampling.value();
      submission.stop = req.stop;
      submission.include_stop_str_in_output = req.include_stop_str_in_output;
      submission.skip_special_tokens = req.skip_special_tokens;
      submissions.push_back(std::move(submission));
    }
  }
  generation->remaining = submissions.size();

  // Held while submitting so no delta is handled before the stream head and the role chunks.
  std::lock_guard lock(generation->mutex);
  for (size_t i = 0; i < submissions.size(); ++i) {
    std::string engine_id = submissions[i].id;
    Status status = submit_to_engine(
        service_, std::move(submissions[i]),
        [generation, i](EngineDelta delta) { generation->on_delta(i, std::move(delta)); });
    if (!status.ok()) {
      for (const std::string& submitted : generation->engine_ids) {
        abort_in_engine(service_, submitted);
      }
      generation->over = true;
      generation->channel.reset();
      return reject(api_error_from_status(status));
    }
    generation->engine_ids.push_back(std::move(engine_id));
  }
  channel->on_cancel([weak = std::weak_ptr<Generation>(generation), this] {
    if (auto gen = weak.lock()) {
      for (const std::string& engine_id : gen->engine_ids) abort_in_engine(service_, engine_id);
    }
  });
  if (req.stream) {
    channel->start_stream(200, "text/event-stream", {});
    for (size_t i = 0; i < generation->choices.size(); ++i) {
      const int index = static_cast<int>(i);
      if (chat) {
        generation->write_event(
            chat_role_chunk(generation->meta, generation->stream_options, index));
      } else if (!generation->choices[i].text.empty()) {  // the echoed prompt comes first
        CompletionChoice echo;
        echo.index = index;
        echo.text = generation->choices[i].text;
        generation->write_event(
            completion_chunk(generation->meta, generation->stream_options, echo));
      }
    }
  }
}

}  // namespace pdserve
