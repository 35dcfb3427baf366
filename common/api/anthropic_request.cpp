#include "common/api/anthropic_request.h"

#include <array>
#include <utility>

#include "common/api/request_reading.h"

namespace pdserve::api {
namespace {

// The Messages fields this translation reads; the others pass through to the chat request.
constexpr std::array<std::string_view, 25> kMessagesFields = {
    "model",         "messages",        "system",
    "max_tokens",    "stop_sequences",  "temperature",
    "top_p",         "top_k",           "tools",
    "tool_choice",   "thinking",        "stream",
    "output_config", "metadata",        "service_tier",
    "container",     "mcp_servers",     "context_management",
    "inference_geo", "cache_control",   "diagnostics",
    "speed",         "user_profile_id", "workspace_id",
    "betas"};

std::string text_block(const Json& block, const std::string& param) {
  const Json& text = required_field(block, "text", param + ".text");
  if (!text.is_string()) refuse_type(param + ".text", "a string", text);
  return text.get<std::string>();
}

std::string block_type(const Json& block, const std::string& param) {
  if (!block.is_object()) refuse_type(param, "an object", block);
  const std::optional<std::string> type = string_field(block, "type", param + ".type");
  if (!type) refuse("Missing required parameter: '" + param + ".type'.", param + ".type");
  return *type;
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& param,
                                    const char* allowed) {
  refuse("Invalid value for '" + param + ".type': \"" + type + "\" is not supported here (" +
             allowed + ").",
         param + ".type");
}

// A tool_result's content: a string or text blocks.
std::string tool_result_text(const Json& block, const std::string& param) {
  const Json* content = field(block, "content");
  if (content == nullptr) return {};
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) refuse_type(param + ".content", "a string or an array", *content);
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string part = param + ".content[" + std::to_string(i) + "]";
    const std::string type = block_type((*content)[i], part);
    if (type != "text") unsupported_block(type, part, "text");
    text += text_block((*content)[i], part);
  }
  return text;
}

void append_user(const Json& content, const std::string& param, Json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  std::string text;
  bool has_text = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block_param = param + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], block_param);
    if (type == "text") {
      text += text_block(content[i], block_param);
      has_text = true;
    } else if (type == "tool_result") {
      const std::optional<std::string> id =
          string_field(content[i], "tool_use_id", block_param + ".tool_use_id");
      if (!id) {
        refuse("Missing required parameter: '" + block_param + ".tool_use_id'.",
               block_param + ".tool_use_id");
      }
      bool_field(content[i], "is_error", block_param + ".is_error");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", *id},
                          {"content", tool_result_text(content[i], block_param)}});
    } else {
      unsupported_block(type, block_param, "text, tool_result");
    }
  }
  if (has_text) messages.push_back({{"role", "user"}, {"content", std::move(text)}});
}

void append_assistant(const Json& content, const std::string& param, Json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "assistant"}, {"content", content}});
    return;
  }
  Json message = {{"role", "assistant"}, {"content", ""}};
  std::string text;
  std::string reasoning;
  Json calls = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block_param = param + "[" + std::to_string(i) + "]";
    const Json& block = content[i];
    const std::string type = block_type(block, block_param);
    if (type == "text") {
      text += text_block(block, block_param);
    } else if (type == "thinking") {
      reasoning += required_string(block, "thinking", block_param + ".thinking");
      string_field(block, "signature", block_param + ".signature");
    } else if (type == "redacted_thinking") {
      continue;
    } else if (type == "tool_use") {
      const std::optional<std::string> id = string_field(block, "id", block_param + ".id");
      const std::optional<std::string> name = string_field(block, "name", block_param + ".name");
      if (!id || !name) {
        const std::string missing = block_param + (id ? ".name" : ".id");
        refuse("Missing required parameter: '" + missing + "'.", missing);
      }
      const Json& input = required_field(block, "input", block_param + ".input");
      if (!input.is_object()) refuse_type(block_param + ".input", "an object", input);
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", input.dump()}}}});
    } else {
      unsupported_block(type, block_param, "text, thinking, tool_use");
    }
  }
  message["content"] = std::move(text);
  if (!reasoning.empty()) message["reasoning_content"] = std::move(reasoning);
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages.push_back(std::move(message));
}

std::string system_text(const Json& system) {
  if (system.is_string()) return system.get<std::string>();
  if (!system.is_array()) refuse_type("system", "a string or an array of text blocks", system);
  std::string text;
  for (size_t i = 0; i < system.size(); ++i) {
    const std::string param = "system[" + std::to_string(i) + "]";
    const std::string type = block_type(system[i], param);
    if (type != "text") unsupported_block(type, param, "text");
    text += text_block(system[i], param);
  }
  return text;
}

Json chat_tools(const Json& tools) {
  if (!tools.is_array()) refuse_type("tools", "an array", tools);
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    const Json& tool = tools[i];
    if (!tool.is_object()) refuse_type(param, "an object", tool);
    const std::string type = string_field(tool, "type", param + ".type").value_or("custom");
    if (type != "custom") {
      refuse("Invalid value for '" + param + ".type': \"" + type +
                 "\" (only client tools, with an input_schema, are supported).",
             param + ".type");
    }
    Json function = Json::object();
    copy_field(tool, "name", function, "name");
    copy_field(tool, "description", function, "description");
    const Json& schema = required_field(tool, "input_schema", param + ".input_schema");
    if (!schema.is_object()) refuse_type(param + ".input_schema", "an object", schema);
    function["parameters"] = schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

Json chat_tool_choice(const Json& choice) {
  if (!choice.is_object()) refuse_type("tool_choice", "an object", choice);
  const std::string type = string_field(choice, "type", "tool_choice.type").value_or("");
  if (type == "auto") return "auto";
  if (type == "any") return "required";
  if (type == "none") return "none";
  if (type == "tool") {
    const Json& name = required_field(choice, "name", "tool_choice.name");
    return {{"type", "function"}, {"function", {{"name", name}}}};
  }
  refuse("Invalid value for 'tool_choice.type': \"" + type + "\" (allowed: auto, any, tool, none).",
         "tool_choice.type");
}

// output_config.format ({"type": "json_schema", "schema"}) as the chat path's response_format;
// output_config.effort has no counterpart (Qwen3 thinks or does not).
std::optional<Json> chat_response_format(const Json& config) {
  if (!config.is_object()) refuse_type("output_config", "an object", config);
  const Json* format = field(config, "format");
  if (format == nullptr) return std::nullopt;
  if (!format->is_object()) refuse_type("output_config.format", "an object", *format);
  const std::string type = string_field(*format, "type", "output_config.format.type").value_or("");
  if (type != "json_schema") {
    refuse(
        "Invalid value for 'output_config.format.type': \"" + type + "\" (allowed: json_schema).",
        "output_config.format.type");
  }
  const Json& schema = required_field(*format, "schema", "output_config.format.schema");
  return Json{{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", schema}}}};
}

std::optional<bool> thinking_enabled(const Json& thinking) {
  if (!thinking.is_object()) refuse_type("thinking", "an object", thinking);
  const std::string type = string_field(thinking, "type", "thinking.type").value_or("");
  if (type == "enabled") return true;
  if (type == "disabled") return false;
  if (type == "adaptive") return std::nullopt;  // the template's default
  refuse("Invalid value for 'thinking.type': \"" + type + "\" (allowed: enabled, disabled).",
         "thinking.type");
}

MessagesRequest translate(const Json& body, MessagesEndpoint endpoint) {
  MessagesRequest out;
  Json& chat = out.chat;
  chat = Json::object();
  const Json& model = required_field(body, "model", "model");
  chat["model"] = model;
  Json messages = Json::array();
  if (const Json* system = field(body, "system")) {
    messages.push_back({{"role", "system"}, {"content", system_text(*system)}});
  }
  const Json& input = required_field(body, "messages", "messages");
  if (!input.is_array()) refuse_type("messages", "an array", input);
  if (input.empty()) refuse("messages: at least one message is required.", "messages");
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    const Json& message = input[i];
    if (!message.is_object()) refuse_type(param, "an object", message);
    const std::string role = string_field(message, "role", param + ".role").value_or("");
    const Json& content = required_field(message, "content", param + ".content");
    if (!content.is_string() && !content.is_array()) {
      refuse_type(param + ".content", "a string or an array of content blocks", content);
    }
    if (role == "user") {
      append_user(content, param + ".content", messages);
    } else if (role == "assistant") {
      append_assistant(content, param + ".content", messages);
    } else {
      refuse("Invalid value for '" + param + ".role': \"" + role + "\" (allowed: user, assistant).",
             param + ".role");
    }
  }
  chat["messages"] = std::move(messages);
  if (const Json* tools = field(body, "tools")) chat["tools"] = chat_tools(*tools);
  if (const Json* choice = field(body, "tool_choice"))
    chat["tool_choice"] = chat_tool_choice(*choice);
  if (const Json* thinking = field(body, "thinking")) {
    if (std::optional<bool> enabled = thinking_enabled(*thinking)) {
      chat["chat_template_kwargs"] = {{"enable_thinking", *enabled}};
    }
  }
  if (endpoint == MessagesEndpoint::kCountTokens) return out;

  if (const Json* config = field(body, "output_config")) {
    if (std::optional<Json> format = chat_response_format(*config)) {
      chat["response_format"] = std::move(*format);
    }
  }

  const Json& max_tokens = required_field(body, "max_tokens", "max_tokens");
  chat["max_completion_tokens"] = max_tokens;
  if (const Json* stop = field(body, "stop_sequences")) {
    if (!stop->is_array()) refuse_type("stop_sequences", "an array of strings", *stop);
    chat["stop"] = *stop;  // the chat path checks each string
  }
  copy_field(body, "temperature", chat, "temperature");
  copy_field(body, "top_p", chat, "top_p");
  copy_field(body, "top_k", chat, "top_k");
  out.stream = bool_field(body, "stream", "stream").value_or(false);
  chat["stream"] = out.stream;
  // message_start carries the prompt's token count: every chunk has the usage so far.
  if (out.stream)
    chat["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  pass_through_extensions(body, kMessagesFields, chat);
  return out;
}

}  // namespace

ApiResult<MessagesRequest> translate_messages_request(std::string_view body,
                                                      MessagesEndpoint endpoint) {
  ApiResult<Json> parsed = parse_request_object(body);
  if (!parsed.ok()) return parsed.error();
  try {
    return translate(parsed.value(), endpoint);
  } catch (const RequestRefusal& refusal) {
    return refusal.error;
  }
}

std::string messages_param(std::string_view chat_param) {
  if (chat_param == "max_completion_tokens" || chat_param == "max_tokens") return "max_tokens";
  if (chat_param == "stop" || chat_param.starts_with("stop[")) {
    return "stop_sequences" + std::string(chat_param.substr(4));
  }
  return std::string(chat_param);
}

}  // namespace pdserve::api
