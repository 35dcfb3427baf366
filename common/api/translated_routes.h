// The routes of the APIs that are translations of a chat completion, for any front end that
// serves chat completions (a serving node, the proxy):
//   POST /v1/responses               OpenAI's Responses API (responses_request.h), stateless:
//                                    no GET / DELETE of stored responses
//   POST /v1/messages                Anthropic's Messages API (anthropic_request.h)
//   POST /v1/messages/count_tokens   the Messages prompt's token count
// Each request is translated to a chat completion (or /tokenize) request and handed to the
// front end's own handler with a TranslatingChannel, so routing, prefill placement and stream
// resumption are the chat path's. Access is the OpenAI API's (a client key as the bearer or
// as x-api-key); the Messages routes answer a 401, like every error, in Anthropic's shape.
#pragma once

#include "common/cluster/cluster_auth.h"
#include "common/http/route_table.h"

namespace pdserve::api {

struct ChatFrontEnd {
  http::Handler chat_completions;  // takes a POST /v1/chat/completions request
  http::Handler tokenize;          // takes a POST /tokenize request
};

void add_translated_routes(http::RouteTable& router, const AccessPolicy& access,
                           ChatFrontEnd front_end);

}  // namespace pdserve::api
