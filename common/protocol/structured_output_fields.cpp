#include "common/protocol/structured_output_fields.h"

#include <utility>

#include "common/core/json_depth.h"
#include "common/grammar/constraint.h"

namespace pdserve::request_fields {
namespace {

void set_structured_output(GenerationRequest& request, StructuredOutput output,
                           const std::string& param, std::optional<std::string>& source) {
  if (source) {
    fail("'" + param + "' and '" + *source + "' both constrain the output; give only one.", param);
  }
  if (output.spec.empty()) fail("Invalid value for '" + param + "': it is empty.", param);
  const Status valid = check_structured_output(output);
  if (!valid.ok()) fail("Invalid value for '" + param + "': " + valid.message(), param);
  request.sampling.structured_output = std::move(output);
  source = param;
}

// A JSON schema given as an object or, as vLLM's guided_json also takes it, a string holding
// one.
std::string schema_text(const Json& value, const std::string& param) {
  if (value.is_object()) return value.dump();
  if (!value.is_string()) fail_type(param, "an object", value);
  const std::string& text = value.get_ref<const std::string&>();
  if (Status depth = check_json_depth(text, "'" + param + "'"); !depth.ok()) {
    fail("Invalid value for '" + param + "': " + depth.message() + ".", param);
  }
  Json parsed;
  try {
    parsed = Json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail("Invalid value for '" + param + "': the string is not a JSON document.", param);
  }
  if (!parsed.is_object()) {
    fail("Invalid value for '" + param + "': a JSON schema is an object.", param);
  }
  return parsed.dump();
}

std::vector<std::string> choice_list(const Json& value, const std::string& param) {
  if (!value.is_array() || value.empty()) {
    fail_type(param, "a non-empty array of strings", value);
  }
  std::vector<std::string> choices;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string item = param + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) fail_type(item, "a string", value[i]);
    if (value[i].get_ref<const std::string&>().empty()) {
      fail("Invalid value for '" + item + "': it is empty.", item);
    }
    choices.push_back(value[i].get<std::string>());
  }
  return choices;
}

const char kAnyObjectSchema[] = R"({"type": "object"})";

}  // namespace

// response_format (OpenAI), guided_json / guided_regex / guided_choice / guided_grammar and
// structured_outputs (vLLM): at most one of them.
void read_structured_output(ObjectReader& reader, GenerationRequest& request) {
  std::optional<std::string> source;
  const auto set = [&](StructuredOutput::Kind kind, std::string spec, const std::string& param) {
    set_structured_output(request, {kind, std::move(spec)}, param, source);
  };
  using Kind = StructuredOutput::Kind;
  if (const Json* format = reader.get("response_format")) {
    if (!format->is_object()) fail_type("response_format", "an object", *format);
    ObjectReader format_reader(*format, "response_format");
    const Json& type = format_reader.require("type");
    if (type == "json_object") {
      set(Kind::kJsonSchema, kAnyObjectSchema, "response_format");
    } else if (type == "json_schema") {
      const Json& json_schema = format_reader.require("json_schema");
      if (!json_schema.is_object()) {
        fail_type("response_format.json_schema", "an object", json_schema);
      }
      ObjectReader schema_reader(json_schema, "response_format.json_schema");
      if (!schema_reader.require("name").is_string()) {
        fail_type("response_format.json_schema.name", "a string", *schema_reader.get("name"));
      }
      schema_reader.string("description");
      schema_reader.boolean("strict");  // the schema is always enforced
      const Json& schema = schema_reader.require("schema");
      if (!schema.is_object()) fail_type("response_format.json_schema.schema", "an object", schema);
      schema_reader.reject_unread();
      set(Kind::kJsonSchema, schema.dump(), "response_format.json_schema.schema");
    } else if (type != "text") {
      fail("Invalid value for 'response_format.type': " + type.dump() +
               " (allowed: \"text\", \"json_object\", \"json_schema\").",
           "response_format.type");
    }
    format_reader.reject_unread();
  }
  if (const Json* json = reader.get("guided_json")) {
    set(Kind::kJsonSchema, schema_text(*json, "guided_json"), "guided_json");
  }
  if (auto regex = reader.string("guided_regex")) set(Kind::kRegex, *regex, "guided_regex");
  if (const Json* choice = reader.get("guided_choice")) {
    set_structured_output(request, choice_output(choice_list(*choice, "guided_choice")),
                          "guided_choice", source);
  }
  if (auto grammar = reader.string("guided_grammar")) {
    set(Kind::kGrammar, *grammar, "guided_grammar");
  }
  if (const Json* outputs = reader.get("structured_outputs")) {
    if (!outputs->is_object()) fail_type("structured_outputs", "an object", *outputs);
    ObjectReader outputs_reader(*outputs, "structured_outputs");
    if (const Json* json = outputs_reader.get("json")) {
      set(Kind::kJsonSchema, schema_text(*json, "structured_outputs.json"),
          "structured_outputs.json");
    }
    if (auto regex = outputs_reader.string("regex")) {
      set(Kind::kRegex, *regex, "structured_outputs.regex");
    }
    if (const Json* choice = outputs_reader.get("choice")) {
      set_structured_output(request,
                            choice_output(choice_list(*choice, "structured_outputs.choice")),
                            "structured_outputs.choice", source);
    }
    if (auto grammar = outputs_reader.string("grammar")) {
      set(Kind::kGrammar, *grammar, "structured_outputs.grammar");
    }
    if (outputs_reader.boolean("json_object").value_or(false)) {
      set(Kind::kJsonSchema, kAnyObjectSchema, "structured_outputs.json_object");
    }
    outputs_reader.reject_unread();
  }
}

// tool_choice "required" or a named function: the output is constrained to Qwen3's hermes
// tool calls (see StructuredOutput::Kind::kToolCalls) of the allowed tools.
void constrain_tool_calls(GenerationRequest& request) {
  const bool required = request.tool_choice == "required";
  if (!required && request.tool_choice != "function") return;
  if (!request.tools.is_array() || request.tools.empty()) {
    fail("Invalid value for 'tool_choice': forcing a tool call needs 'tools'.", "tool_choice");
  }
  if (request.sampling.structured_output) {
    fail(
        "'tool_choice' forces a tool call, which cannot be combined with another structured "
        "output.",
        "tool_choice");
  }
  Json tools = Json::array();
  for (const Json& tool : request.tools) {
    const Json& function = tool.at("function");
    const std::string& name = function.at("name").get_ref<const std::string&>();
    if (!required && name != request.tool_choice_function) continue;
    Json entry = {{"name", name}};
    if (auto parameters = function.find("parameters"); parameters != function.end()) {
      entry["parameters"] = *parameters;
    }
    tools.push_back(std::move(entry));
  }
  if (tools.empty()) {
    fail("Invalid value for 'tool_choice.function.name': no tool is named \"" +
             request.tool_choice_function + "\".",
         "tool_choice.function.name");
  }
  std::optional<std::string> source;
  set_structured_output(request,
                        {StructuredOutput::Kind::kToolCalls,
                         Json{{"tools", std::move(tools)}, {"multiple", required}}.dump()},
                        "tools", source);
}

}  // namespace pdserve::request_fields
