// Typed reads of a translated API's request body (Responses, Anthropic Messages): each names
// the offending field in its 400. Private to common/api: the translators throw RequestRefusal
// and catch it at their entry points, as common/protocol's parsers do.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/protocol/openai_error.h"

namespace pdserve::api {

using Json = nlohmann::ordered_json;

struct RequestRefusal {
  ApiError error;
};

[[noreturn]] void refuse(std::string message, const std::string& param);
[[noreturn]] void refuse_type(const std::string& param, const char* expected, const Json& got);

// `object[key]` when present and not null, else nullptr.
const Json* field(const Json& object, std::string_view key);
const Json& required_field(const Json& object, std::string_view key, const std::string& param);
std::optional<std::string> string_field(const Json& object, std::string_view key,
                                        const std::string& param);
std::string required_string(const Json& object, std::string_view key, const std::string& param);
std::optional<bool> bool_field(const Json& object, std::string_view key, const std::string& param);

// "a.b" from "a" and "b" ("b" alone when `path` is empty).
std::string join_param(const std::string& path, std::string_view key);

// Copies `object[from]` (when present) to `out[to]` as it is: its checks are the chat parser's.
void copy_field(const Json& object, std::string_view from, Json& out, std::string_view to);

// Copies the body's fields that are not in `known` (the chat path's extensions: top_k, seed,
// ...) to `chat` unless it has them; a field that would change the chat answer's shape, which
// the translation relies on (n, echo, logprobs, stream_options, ...), is a 400.
void pass_through_extensions(const Json& body, std::span<const std::string_view> known, Json& chat);

// The body as a JSON object (bounded depth), or the 400 to answer.
ApiResult<Json> parse_request_object(std::string_view body);

}  // namespace pdserve::api
