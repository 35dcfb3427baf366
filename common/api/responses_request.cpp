#include "common/api/responses_request.h"

#include <array>
#include <string>
#include <utility>

#include "common/api/request_reading.h"

namespace pdserve::api {
namespace {

// The Responses fields this translation reads; every other field goes to the chat request as
// it is (the chat path's extensions, or a field it ignores or refuses).
constexpr std::array<std::string_view, 22> kResponsesFields = {"model",
                                                               "input",
                                                               "instructions",
                                                               "max_output_tokens",
                                                               "temperature",
                                                               "top_p",
                                                               "tools",
                                                               "tool_choice",
                                                               "parallel_tool_calls",
                                                               "text",
                                                               "stream",
                                                               "store",
                                                               "previous_response_id",
                                                               "background",
                                                               "metadata",
                                                               "user",
                                                               "include",
                                                               "truncation",
                                                               "reasoning",
                                                               "service_tier",
                                                               "prompt_cache_key",
                                                               "safety_identifier"};

// Text of a message's content: a string, or input_text / output_text parts joined.
std::string content_text(const Json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) refuse_type(param, "a string or an array of content parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    const Json& part = content[i];
    if (!part.is_object()) refuse_type(part_param, "an object", part);
    const std::optional<std::string> type = string_field(part, "type", part_param + ".type");
    if (type != "input_text" && type != "output_text") {
      refuse("Invalid value for '" + part_param +
                 ".type': " + (type ? "\"" + *type + "\"" : "none") +
                 " (only text parts are supported: input_text, output_text).",
             part_param + ".type");
    }
    const Json& part_text = required_field(part, "text", part_param + ".text");
    if (!part_text.is_string()) refuse_type(part_param + ".text", "a string", part_text);
    text += part_text.get<std::string>();
  }
  return text;
}

// The arguments of a function_call item, as a JSON text.
std::string call_arguments(const Json& item, const std::string& param) {
  const Json& arguments = required_field(item, "arguments", param + ".arguments");
  if (!arguments.is_string()) refuse_type(param + ".arguments", "a string", arguments);
  return arguments.get<std::string>();
}

// input's items as chat messages; consecutive function calls join one assistant message.
void append_input_items(const Json& input, Json& messages) {
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string param = "input[" + std::to_string(i) + "]";
    const Json& item = input[i];
    if (!item.is_object()) refuse_type(param, "an object", item);
    const std::string type = string_field(item, "type", param + ".type").value_or("message");
    if (type == "message") {
      const std::string role = string_field(item, "role", param + ".role").value_or("");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        refuse("Invalid value for '" + param + ".role': \"" + role +
                   "\" (allowed: user, assistant, system, developer).",
               param + ".role");
      }
      const Json& content = required_field(item, "content", param + ".content");
      messages.push_back({{"role", role == "developer" ? "system" : role},
                          {"content", content_text(content, param + ".content")}});
    } else if (type == "function_call") {
      const std::string call_id = required_string(item, "call_id", param + ".call_id");
      const std::optional<std::string> name = string_field(item, "name", param + ".name");
      if (!name) refuse("Missing required parameter: '" + param + ".name'.", param + ".name");
      Json call = {{"id", call_id},
                   {"type", "function"},
                   {"function", {{"name", *name}, {"arguments", call_arguments(item, param)}}}};
      if (!messages.empty() && messages.back()["role"] == "assistant" &&
          messages.back().contains("tool_calls")) {
        messages.back()["tool_calls"].push_back(std::move(call));
      } else {
        messages.push_back(
            {{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}});
      }
    } else if (type == "function_call_output") {
      const std::string call_id = required_string(item, "call_id", param + ".call_id");
      const Json& output = required_field(item, "output", param + ".output");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", call_id},
                          {"content", content_text(output, param + ".output")}});
    } else if (type == "reasoning") {
      continue;  // the chat template drops earlier turns' reasoning anyway
    } else {
      refuse("Invalid value for '" + param + ".type': \"" + type +
                 "\" (supported: message, function_call, function_call_output, reasoning).",
             param + ".type");
    }
  }
}

Json chat_tools(const Json& tools) {
  if (!tools.is_array()) refuse_type("tools", "an array", tools);
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    const Json& tool = tools[i];
    if (!tool.is_object()) refuse_type(param, "an object", tool);
    const std::string type = string_field(tool, "type", param + ".type").value_or("");
    if (type != "function") {
      refuse("Invalid value for '" + param + ".type': \"" + type +
                 "\" (only function tools are supported).",
             param + ".type");
    }
    Json function = Json::object();
    copy_field(tool, "name", function, "name");
    copy_field(tool, "description", function, "description");
    copy_field(tool, "parameters", function, "parameters");
    copy_field(tool, "strict", function, "strict");
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

Json chat_tool_choice(const Json& choice) {
  if (choice.is_string()) return choice;  // none, auto, required: the chat path's values
  if (!choice.is_object()) refuse_type("tool_choice", "a string or an object", choice);
  const std::string type = string_field(choice, "type", "tool_choice.type").value_or("");
  if (type != "function") {
    refuse("Invalid value for 'tool_choice.type': \"" + type + "\" (allowed: function).",
           "tool_choice.type");
  }
  const Json& name = required_field(choice, "name", "tool_choice.name");
  return {{"type", "function"}, {"function", {{"name", name}}}};
}

// text.format as the chat path's response_format (absent for plain text).
std::optional<Json> chat_response_format(const Json& text) {
  if (!text.is_object()) refuse_type("text", "an object", text);
  const Json* format = field(text, "format");
  if (format == nullptr) return std::nullopt;
  if (!format->is_object()) refuse_type("text.format", "an object", *format);
  const std::string type = string_field(*format, "type", "text.format.type").value_or("");
  if (type == "text") return std::nullopt;
  if (type == "json_object") return Json{{"type", "json_object"}};
  if (type != "json_schema") {
    refuse("Invalid value for 'text.format.type': \"" + type +
               "\" (allowed: text, json_object, json_schema).",
           "text.format.type");
  }
  Json schema = Json::object();
  schema["name"] = string_field(*format, "name", "text.format.name").value_or("response");
  schema["schema"] = required_field(*format, "schema", "text.format.schema");
  copy_field(*format, "strict", schema, "strict");
  copy_field(*format, "description", schema, "description");
  return Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

ResponsesRequest translate(const Json& body) {
  if (bool_field(body, "store", "store").value_or(false)) {
    refuse("Responses are not stored by this server: set 'store' to false (or leave it out).",
           "store");
  }
  if (field(body, "previous_response_id") != nullptr) {
    refuse(
        "'previous_response_id' is not supported: responses are not stored. Send the whole "
        "conversation in 'input'.",
        "previous_response_id");
  }
  if (bool_field(body, "background", "background").value_or(false)) {
    refuse("Background responses are not supported.", "background");
  }
  ResponsesRequest out;
  Json& chat = out.chat;
  chat = Json::object();
  copy_field(body, "model", chat, "model");
  Json messages = Json::array();
  const std::optional<std::string> instructions =
      string_field(body, "instructions", "instructions");
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  const Json& input = required_field(body, "input", "input");
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    if (input.empty()) refuse("Invalid value for 'input': the list is empty.", "input");
    append_input_items(input, messages);
  } else {
    refuse_type("input", "a string or an array of input items", input);
  }
  chat["messages"] = std::move(messages);
  copy_field(body, "max_output_tokens", chat, "max_completion_tokens");
  copy_field(body, "temperature", chat, "temperature");
  copy_field(body, "top_p", chat, "top_p");
  copy_field(body, "parallel_tool_calls", chat, "parallel_tool_calls");
  if (const Json* tools = field(body, "tools")) chat["tools"] = chat_tools(*tools);
  if (const Json* choice = field(body, "tool_choice"))
    chat["tool_choice"] = chat_tool_choice(*choice);
  if (const Json* text = field(body, "text")) {
    if (std::optional<Json> format = chat_response_format(*text)) {
      chat["response_format"] = std::move(*format);
    }
  }
  out.stream = bool_field(body, "stream", "stream").value_or(false);
  chat["stream"] = out.stream;
  // The response's usage needs the chat stream's usage chunk.
  if (out.stream) chat["stream_options"] = {{"include_usage", true}};
  pass_through_extensions(body, kResponsesFields, chat);

  Json& echo = out.echo;
  echo["instructions"] = instructions ? Json(*instructions) : Json(nullptr);
  echo["max_output_tokens"] = body.value("max_output_tokens", Json(nullptr));
  echo["metadata"] = body.value("metadata", Json::object());
  echo["parallel_tool_calls"] = body.value("parallel_tool_calls", Json(true));
  echo["temperature"] = body.value("temperature", Json(nullptr));
  echo["text"] = body.value("text", Json{{"format", {{"type", "text"}}}});
  echo["tool_choice"] = body.value("tool_choice", Json("auto"));
  echo["tools"] = body.value("tools", Json::array());
  echo["top_p"] = body.value("top_p", Json(nullptr));
  echo["user"] = body.value("user", Json(nullptr));
  return out;
}

}  // namespace

ApiResult<ResponsesRequest> translate_responses_request(std::string_view body) {
  ApiResult<Json> parsed = parse_request_object(body);
  if (!parsed.ok()) return parsed.error();
  try {
    return translate(parsed.value());
  } catch (const RequestRefusal& refusal) {
    return refusal.error;
  }
}

std::string responses_param(std::string_view chat_param) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kRenamed = {{
      {"messages", "input"},
      {"max_completion_tokens", "max_output_tokens"},
      {"max_tokens", "max_output_tokens"},
      {"response_format", "text.format"},
  }};
  for (const auto& [chat, responses] : kRenamed) {
    if (chat_param == chat) return std::string(responses);
    if (chat_param.starts_with(chat) && (chat_param.size() > chat.size()) &&
        (chat_param[chat.size()] == '.' || chat_param[chat.size()] == '[')) {
      return std::string(responses) + std::string(chat_param.substr(chat.size()));
    }
  }
  return std::string(chat_param);
}

}  // namespace pdserve::api
