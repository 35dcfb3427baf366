#include "common/protocol/chat_request_fields.h"

#include <utility>

namespace pdserve::request_fields {
namespace {

std::string message_content(const Json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) fail_type(param, "a string or an array of content parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    std::string part_param = param + "[" + std::to_string(i) + "]";
    const Json& part = content[i];
    if (!part.is_object()) fail_type(part_param, "an object", part);
    ObjectReader reader(part, part_param);
    std::string type = reader.string("type").value_or("");
    if (type != "text") {
      fail("Invalid value for '" + part_param +
               ".type': only \"text\" content parts are "
               "supported, got \"" +
               type + "\".",
           part_param + ".type");
    }
    const Json& part_text = reader.require("text");
    if (!part_text.is_string()) fail_type(part_param + ".text", "a string", part_text);
    reader.reject_unread();
    if (i > 0) text += '\n';
    text += part_text.get<std::string>();
  }
  return text;
}

// Arguments as the chat template should see them: vLLM hands templates the object a JSON
// string holds (Qwen3's writes it back with tojson, in the spacing it was trained on); other
// text stays a string, which the template writes as it is.
Json template_arguments(const std::string& arguments) {
  if (!check_json_depth(arguments, "arguments").ok()) return arguments;
  Json parsed = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return parsed.is_object() ? parsed : Json(arguments);
}

Json read_tool_calls(const Json& calls, const std::string& param) {
  if (!calls.is_array()) fail_type(param, "an array", calls);
  Json normalized = calls;
  for (size_t i = 0; i < calls.size(); ++i) {
    std::string call_param = param + "[" + std::to_string(i) + "]";
    if (!calls[i].is_object()) fail_type(call_param, "an object", calls[i]);
    ObjectReader reader(calls[i], call_param);
    reader.string("id");
    std::string type = reader.string("type").value_or("function");
    if (type != "function") {
      fail("Invalid value for '" + call_param + ".type': expected \"function\".",
           call_param + ".type");
    }
    const Json& function = reader.require("function");
    if (!function.is_object()) fail_type(call_param + ".function", "an object", function);
    ObjectReader function_reader(function, call_param + ".function");
    const Json& name = function_reader.require("name");
    if (!name.is_string()) fail_type(call_param + ".function.name", "a string", name);
    const Json& arguments = function_reader.require("arguments");
    if (!arguments.is_string())
      fail_type(call_param + ".function.arguments", "a string", arguments);
    function_reader.reject_unread();
    reader.reject_unread();
    normalized[i]["function"]["arguments"] =
        template_arguments(arguments.get_ref<const std::string&>());
  }
  return normalized;
}

}  // namespace

Json read_message(const Json& message, const std::string& param) {
  if (!message.is_object()) fail_type(param, "an object", message);
  ObjectReader reader(message, param);
  const Json& role_value = reader.require("role");
  if (!role_value.is_string()) fail_type(param + ".role", "a string", role_value);
  std::string role = role_value.get<std::string>();
  // OpenAI's newer name for the system role (o1 and later); the chat template knows "system".
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
    fail("Invalid value for '" + param + ".role': \"" + role +
             "\" (allowed: system, developer, user, assistant, tool).",
         param + ".role");
  }
  Json normalized = Json::object();
  normalized["role"] = role;
  const Json* content = reader.get("content");
  if (content == nullptr && role != "assistant") {
    fail("Missing required parameter: '" + param + ".content'.", param + ".content");
  }
  normalized["content"] = content == nullptr ? "" : message_content(*content, param + ".content");
  if (auto name = reader.string("name")) normalized["name"] = *name;
  if (role == "assistant") {
    if (const Json* calls = reader.get("tool_calls")) {
      normalized["tool_calls"] = read_tool_calls(*calls, param + ".tool_calls");
    }
    if (auto reasoning = reader.string("reasoning_content")) {
      normalized["reasoning_content"] = *reasoning;
    }
  }
  if (role == "tool") {
    if (auto id = reader.string("tool_call_id")) normalized["tool_call_id"] = *id;
  }
  reader.reject_unread();
  return normalized;
}

Json read_tools(const Json& tools) {
  if (!tools.is_array()) fail_type("tools", "an array", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string param = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) fail_type(param, "an object", tools[i]);
    ObjectReader reader(tools[i], param);
    const Json& type = reader.require("type");
    if (type != "function") {
      fail("Invalid value for '" + param + ".type': expected \"function\".", param + ".type");
    }
    const Json& function = reader.require("function");
    if (!function.is_object()) fail_type(param + ".function", "an object", function);
    ObjectReader function_reader(function, param + ".function");
    const Json& name = function_reader.require("name");
    if (!name.is_string()) fail_type(param + ".function.name", "a string", name);
    if (name.get_ref<const std::string&>().empty()) {
      fail("Invalid value for '" + param + ".function.name': it must not be empty.",
           param + ".function.name");
    }
    function_reader.string("description");
    function_reader.boolean("strict");
    if (const Json* parameters = function_reader.get("parameters")) {
      if (!parameters->is_object())
        fail_type(param + ".function.parameters", "an object", *parameters);
    }
    function_reader.reject_unread();
    reader.reject_unread();
  }
  return tools;
}

void read_tool_choice(ObjectReader& reader, GenerationRequest& request) {
  const Json* choice = reader.get("tool_choice");
  if (choice == nullptr) return;
  if (choice->is_string()) {
    if (*choice != "none" && *choice != "auto" && *choice != "required") {
      fail("Invalid value for 'tool_choice': " + choice->dump() +
               " (allowed: \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
               "\"function\": {\"name\": ...}}).",
           "tool_choice");
    }
    request.tool_choice = choice->get<std::string>();
    return;
  }
  if (!choice->is_object()) fail_type("tool_choice", "a string or an object", *choice);
  ObjectReader choice_reader(*choice, "tool_choice");
  if (choice_reader.require("type") != "function") {
    fail("Invalid value for 'tool_choice.type': expected \"function\".", "tool_choice.type");
  }
  const Json& function = choice_reader.require("function");
  if (!function.is_object()) fail_type("tool_choice.function", "an object", function);
  ObjectReader function_reader(function, "tool_choice.function");
  const Json& name = function_reader.require("name");
  if (!name.is_string()) fail_type("tool_choice.function.name", "a string", name);
  function_reader.reject_unread();
  choice_reader.reject_unread();
  request.tool_choice = "function";
  request.tool_choice_function = name.get<std::string>();
}

// Sets the request's one structured output, named by `param` in errors; 400 when another
// field already constrains the output or xgrammar refuses it.

void read_chat_template_kwargs(ObjectReader& reader, GenerationRequest& request) {
  const Json* kwargs = reader.get("chat_template_kwargs");
  if (kwargs == nullptr) return;
  if (!kwargs->is_object()) fail_type("chat_template_kwargs", "an object", *kwargs);
  for (const char* reserved : {"messages", "tools"}) {
    if (kwargs->contains(reserved)) {
      fail(std::string("Invalid value for 'chat_template_kwargs': '") + reserved +
               "' is set by the request itself.",
           std::string("chat_template_kwargs.") + reserved);
    }
  }
  if (auto it = kwargs->find("enable_thinking"); it != kwargs->end() && !it->is_null()) {
    if (!it->is_boolean()) fail_type("chat_template_kwargs.enable_thinking", "a boolean", *it);
    request.enable_thinking = it->get<bool>();
  }
  request.chat_template_kwargs = *kwargs;
}

// vLLM's echo, add_generation_prompt and continue_final_message. Both of the last two true is a
// 400 (vLLM's check, on the fields); chat_template_kwargs' add_generation_prompt then wins
// over the field (vLLM's kwargs update the template variables last).
void read_chat_prompt_shape(ObjectReader& reader, GenerationRequest& request) {
  if (auto v = reader.boolean("echo")) request.echo = *v;
  if (auto v = reader.boolean("add_generation_prompt")) request.add_generation_prompt = *v;
  if (auto v = reader.boolean("continue_final_message")) request.continue_final_message = *v;
  if (request.continue_final_message && request.add_generation_prompt) {
    fail(
        "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true: set "
        "'add_generation_prompt' to false to continue the final message.",
        "continue_final_message");
  }
  if (auto it = request.chat_template_kwargs.find("add_generation_prompt");
      it != request.chat_template_kwargs.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      fail_type("chat_template_kwargs.add_generation_prompt", "a boolean", *it);
    }
    request.add_generation_prompt = it->get<bool>();
  }
}

}  // namespace pdserve::request_fields
