#include "common/api/request_reading.h"

#include <algorithm>
#include <array>
#include <utility>

#include "common/core/json_depth.h"

namespace pdserve::api {
namespace {

std::string type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

}  // namespace

void refuse(std::string message, const std::string& param) {
  throw RequestRefusal{invalid_request(std::move(message), param)};
}

void refuse_type(const std::string& param, const char* expected, const Json& got) {
  refuse("Invalid type for '" + param + "': expected " + expected + ", but got " + type_name(got) +
             ".",
         param);
}

std::string join_param(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

const Json* field(const Json& object, std::string_view key) {
  const auto it = object.find(std::string(key));
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& required_field(const Json& object, std::string_view key, const std::string& param) {
  const Json* value = field(object, key);
  if (value == nullptr) refuse("Missing required parameter: '" + param + "'.", param);
  return *value;
}

std::optional<std::string> string_field(const Json& object, std::string_view key,
                                        const std::string& param) {
  const Json* value = field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) refuse_type(param, "a string", *value);
  return value->get<std::string>();
}

std::string required_string(const Json& object, std::string_view key, const std::string& param) {
  const Json& value = required_field(object, key, param);
  if (!value.is_string()) refuse_type(param, "a string", value);
  return value.get<std::string>();
}

std::optional<bool> bool_field(const Json& object, std::string_view key, const std::string& param) {
  const Json* value = field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) refuse_type(param, "a boolean", *value);
  return value->get<bool>();
}

void copy_field(const Json& object, std::string_view from, Json& out, std::string_view to) {
  if (const Json* value = field(object, from)) out[std::string(to)] = *value;
}

void pass_through_extensions(const Json& body, std::span<const std::string_view> known,
                             Json& chat) {
  static constexpr std::array<std::string_view, 9> kShapeFields = {"n",
                                                                   "echo",
                                                                   "logprobs",
                                                                   "top_logprobs",
                                                                   "stream_options",
                                                                   "prompt",
                                                                   "messages",
                                                                   "continue_final_message",
                                                                   "add_generation_prompt"};
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::ranges::find(known, it.key()) != known.end()) continue;
    if (std::ranges::find(kShapeFields, it.key()) != kShapeFields.end()) {
      refuse("'" + it.key() + "' is not a field of this API.", it.key());
    }
    if (!chat.contains(it.key())) chat[it.key()] = it.value();
  }
}

ApiResult<Json> parse_request_object(std::string_view body) {
  if (Status depth = check_json_depth(body, "the request body"); !depth.ok()) {
    return invalid_request(depth.message());
  }
  Json parsed = Json::parse(body, nullptr, false);
  if (parsed.is_discarded()) {
    return invalid_request("The request body is not valid JSON.");
  }
  if (!parsed.is_object()) return invalid_request("The request body must be a JSON object.");
  return parsed;
}

}  // namespace pdserve::api
