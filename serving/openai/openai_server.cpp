#include "serving/openai/openai_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "common/api/translated_routes.h"
#include "common/http/api_error_response.h"
#include "common/http/service_routes.h"
#include "common/protocol/chat_prompt.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_request.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/pdserve_headers.h"
#include "serving/openai/generation_request.h"
#include "serving/openai/generation_stream.h"

namespace pdserve {
namespace {

http::HttpResponse json_response(int status, std::string body) {
  return {status, "application/json", {}, std::move(body)};
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

OpenAiServer::OpenAiServer(InferenceService& service, const Tokenizer& tokenizer,
                           const ChatTemplate& chat_template, OpenAiOptions options)
    : service_(service),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      options_(options),
      request_metrics_(metrics_, service.model_info()),
      // Counters start at the engine's totals now: the warm-up's tokens are not traffic.
      engine_metrics_(metrics_, service.model_info().name, NodeRole::kDecode, service.stats()),
      id_prefix_(random_id_prefix()) {}

OpenAiServer::~OpenAiServer() = default;

void OpenAiServer::register_routes(http::RouteTable& router) {
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
  // The Responses and Messages APIs: translations of a chat completion (common/api).
  api::add_translated_routes(
      router, access,
      {[this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
         handle_generation(request, ch, true);
       },
       [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
         handle_tokenize(request, ch);
       }});
  // The port opens only once the model is loaded and the engine runs: serving is ready.
  http::add_service_routes(router, {},
                           [this](int status) { request_metrics_.count_response(status); });
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_metrics(ch);
             });
}

void OpenAiServer::reply_error(http::ResponseChannel& channel, const ApiError& error) {
  request_metrics_.count_response(error.http_status);
  channel.send(http::api_error_response(error));
}

void OpenAiServer::abort_requests(const std::vector<std::string>& engine_ids) {
  for (const std::string& engine_id : engine_ids) service_.abort(engine_id);
}

nlohmann::ordered_json OpenAiServer::model_card() const {
  const ModelInfo& model = service_.model_info();
  nlohmann::ordered_json card;
  card["id"] = model.name;
  card["object"] = "model";
  card["created"] = unix_seconds();
  card["owned_by"] = "pdserve";
  card["max_model_len"] = model.max_model_len;
  return card;
}

void OpenAiServer::handle_models(const std::shared_ptr<http::ResponseChannel>& channel) {
  nlohmann::ordered_json body;
  body["object"] = "list";
  body["data"] = nlohmann::ordered_json::array({model_card()});
  request_metrics_.count_response(200);
  channel->send(json_response(200, to_json_text(body)));
}

void OpenAiServer::handle_model(const http::HttpRequest& request,
                                const std::shared_ptr<http::ResponseChannel>& channel) {
  // The id may hold a slash ("Qwen/Qwen3-0.6B"), sent as is or percent-encoded.
  const std::string id = percent_decoded(
      std::string_view(request.path).substr(std::string_view("/v1/models/").size()));
  if (id != service_.model_info().name) return reply_error(*channel, model_not_found(id));
  request_metrics_.count_response(200);
  channel->send(json_response(200, to_json_text(model_card())));
}

void OpenAiServer::handle_tokenize(const http::HttpRequest& request,
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
  request_metrics_.count_response(200);
  channel->send(json_response(200, to_json_text(out)));
}

void OpenAiServer::handle_detokenize(const http::HttpRequest& request,
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
  request_metrics_.count_response(200);
  channel->send(json_response(200, to_json_text(nlohmann::ordered_json{{"prompt", *text}})));
}

void OpenAiServer::handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel) {
  engine_metrics_.publish(service_.stats(), options_.draining && options_.draining());
  request_metrics_.count_response(200);
  channel->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
}

std::string OpenAiServer::next_serial() {
  char serial[40];
  std::snprintf(serial, sizeof(serial), "%016llx%016llx",
                static_cast<unsigned long long>(id_prefix_),
                static_cast<unsigned long long>(++next_id_));
  return serial;
}

void OpenAiServer::handle_generation(const http::HttpRequest& request,
                                     const std::shared_ptr<http::ResponseChannel>& channel,
                                     bool chat) {
  const SteadyTime arrival = std::chrono::steady_clock::now();
  const auto reject = [&](const ApiError& error) { reply_error(*channel, error); };
  const ModelInfo& model = service_.model_info();
  ApiResult<PreparedGeneration> prepared =
      prepare_generation(request, chat,
                         {tokenizer_, chat_template_, model, options_.strict_request_fields,
                          options_.test_scripted_output, options_.access.cluster_token});
  if (!prepared.ok()) return reject(prepared.error());
  const GenerationRequest& req = prepared.value().request;
  const std::optional<StreamResume>& resume = prepared.value().resume;

  auto generation =
      std::make_shared<GenerationStream>(request_metrics_, tokenizer_, channel, chat, req.stream);
  generation->chat_echo = prepared.value().chat_echo;
  generation->want_logprobs = req.sampling.want_logprobs;
  generation->top_logprobs = req.sampling.logprobs;
  generation->echo_logprobs = !chat && req.echo && req.sampling.want_logprobs;
  generation->prompt_logprobs = req.prompt_logprobs;
  generation->stream_options.include_usage = req.include_usage;
  generation->continuous_usage = req.include_usage && req.continuous_usage_stats;
  generation->arrival = arrival;
  const http::TraceContext trace = trace_ids_.context_for(request.header(kTraceparentHeader));
  generation->trace_id = trace.trace_id;
  generation->node = "decode http://" + std::string(request.header("Host").value_or("unknown"));
  generation->wants_timeline = timeline_requested(request.header(kTimelineHeader));
  const std::string serial = next_serial();
  generation->meta = {(chat ? "chatcmpl-" : "cmpl-") + serial, unix_seconds(), model.name};
  if (resume) {
    generation->meta.id = resume->id;
    generation->meta.created = resume->created;
    generation->resumed = true;
  }
  generation->resumable = prepared.value().resumable;

  std::vector<InferenceRequest> requests;
  std::vector<size_t> request_choices;  // a resumed stream's finished choices have no request
  for (const PreparedPrompt& prompt : prepared.value().prompts) {
    ApiResult<int> max_tokens =
        resolve_max_tokens(req, static_cast<int>(prompt.tokens.size()), model.max_model_len);
    if (!max_tokens.ok()) return reject(max_tokens.error());
    ApiResult<SamplingParams> sampling =
        req.resolved_sampling(model.generation_defaults, max_tokens.value(), model.vocab_size);
    if (!sampling.ok()) return reject(sampling.error());
    sampling.value().scripted_output = prepared.value().scripted_output;
    for (int sample = 0; sample < req.n; ++sample) {
      const size_t choice_index = generation->choices.size();
      const ResumedChoice* resumed = resume ? &resume->choices[choice_index] : nullptr;
      GenerationStream::Choice choice;
      choice.counts_prompt = sample == 0;
      choice.prompt_length = static_cast<int>(prompt.tokens.size());
      choice.text = prompt.echo;
      choice.first_prompt_token = prompt.tokens.front();
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
      engine_request.id = (resume ? generation->meta.id + "." + serial : generation->meta.id) +
                          "-" + std::to_string(choice_index);
      engine_request.prompt_tokens = prompt.tokens;
      engine_request.sampling = sampling.value();
      // vLLM's parallel sampling: choice i of a seeded request draws with seed + i, so that
      // the n answers differ and each equals an n = 1 request with that seed.
      if (engine_request.sampling.seed) *engine_request.sampling.seed += sample;
      engine_request.stop = req.stop;
      engine_request.include_stop_str_in_output = req.include_stop_str_in_output;
      engine_request.skip_special_tokens = req.skip_special_tokens;
      engine_request.report_sampler_state = generation->resumable;
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
        generation->answer_elsewhere();
        submitted_before_failure = generation->engine_ids;
        submit_error = api_error_from_status(status);
        break;
      }
      generation->engine_ids.push_back(std::move(engine_id));
      generation->engine_choices.push_back(choice);
    }
    if (!submit_error && !remote_prefill) generation->open();
  }
  if (submit_error) {
    abort_requests(submitted_before_failure);
    return reject(*submit_error);
  }
  channel->on_cancel([weak = std::weak_ptr<GenerationStream>(generation), this] {
    if (auto gen = weak.lock()) abort_requests(gen->engine_ids);
  });
}

}  // namespace pdserve
