#include "common/api/translated_routes.h"

#include <memory>
#include <utility>

#include "common/api/anthropic_answer.h"
#include "common/api/anthropic_error.h"
#include "common/api/anthropic_request.h"
#include "common/api/count_tokens_answer.h"
#include "common/api/responses_answer.h"
#include "common/api/responses_request.h"
#include "common/api/translating_channel.h"
#include "common/http/api_error_response.h"

namespace pdserve::api {
namespace {

// `request` with the chat path's target and body (headers kept: credentials, traceparent).
http::HttpRequest retargeted(const http::HttpRequest& request, std::string path,
                             const nlohmann::ordered_json& body) {
  http::HttpRequest out = request;
  out.target = path;
  out.path = std::move(path);
  out.body = body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return out;
}

// `handler` behind the client access check, its 401 in Anthropic's shape.
http::Handler anthropic_guarded(const AccessPolicy& policy, http::Handler handler) {
  return [policy, handler = std::move(handler)](const http::HttpRequest& request,
                                                std::shared_ptr<http::ResponseChannel> channel) {
    if (std::optional<ApiError> refused = check_access(policy, RouteAccess::kClient, request)) {
      channel->send(anthropic_error_response(*refused));
      return;
    }
    handler(request, std::move(channel));
  };
}

}  // namespace

void add_translated_routes(http::RouteTable& router, const AccessPolicy& access,
                           ChatFrontEnd front_end) {
  const auto shared = std::make_shared<const ChatFrontEnd>(std::move(front_end));
  router.add(
      "POST", "/v1/responses",
      guarded(
          access, RouteAccess::kClient,
          [shared](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
            ApiResult<ResponsesRequest> translated = translate_responses_request(request.body);
            if (!translated.ok()) return ch->send(http::api_error_response(translated.error()));
            shared->chat_completions(
                retargeted(request, "/v1/chat/completions", translated->chat),
                std::make_shared<TranslatingChannel>(
                    ch, std::make_unique<ResponsesAnswer>(std::move(translated->echo))));
          }));
  router.add("POST", "/v1/messages",
             anthropic_guarded(access, [shared](const http::HttpRequest& request,
                                                std::shared_ptr<http::ResponseChannel> ch) {
               ApiResult<MessagesRequest> translated =
                   translate_messages_request(request.body, MessagesEndpoint::kCreate);
               if (!translated.ok()) return ch->send(anthropic_error_response(translated.error()));
               shared->chat_completions(
                   retargeted(request, "/v1/chat/completions", translated->chat),
                   std::make_shared<TranslatingChannel>(ch, std::make_unique<AnthropicAnswer>()));
             }));
  router.add("POST", "/v1/messages/count_tokens",
             anthropic_guarded(access, [shared](const http::HttpRequest& request,
                                                std::shared_ptr<http::ResponseChannel> ch) {
               ApiResult<MessagesRequest> translated =
                   translate_messages_request(request.body, MessagesEndpoint::kCountTokens);
               if (!translated.ok()) return ch->send(anthropic_error_response(translated.error()));
               shared->tokenize(
                   retargeted(request, "/tokenize", translated->chat),
                   std::make_shared<TranslatingChannel>(ch, std::make_unique<CountTokensAnswer>()));
             }));
}

}  // namespace pdserve::api
