#include "common/protocol/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <set>
#include <utility>

#include "common/grammar/constraint.h"

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;

// Thrown deep inside the parser and caught at the public entry points (the module's
// exception policy, carrying an ApiError so that the offending field is named).
struct RequestError {
  ApiError error;
};

[[noreturn]] void fail(std::string message, const std::string& param) {
  std::optional<std::string> named;
  if (!param.empty()) named = param;
  throw RequestError{invalid_request(std::move(message), std::move(named))};
}

std::string type_name(const Json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

[[noreturn]] void fail_type(const std::string& param, const char* expected, const Json& got) {
  fail("Invalid type for '" + param + "': expected " + expected + ", but got " + type_name(got) +
           " instead.",
       param);
}

std::string number_text(double value) {
  Json number = value;
  return number.dump();
}

// JSON Schema's integer: a number without a fractional part, 16 as well as 16.0 (pydantic's
// lax mode, which vLLM validates with, accepts both too).
bool is_integral(const Json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double number = value.get<double>();
  return std::isfinite(number) && std::floor(number) == number;
}

// An integral JSON number as int64; false when it does not fit (above INT64_MAX, which JSON
// keeps as unsigned, or a float outside the int64 range).
bool fits_int64(const Json& integer, int64_t& out) {
  if (integer.is_number_float()) {
    const double number = integer.get<double>();
    // 2^63 is exactly representable; every double below it converts without overflow.
    if (!(number >= -9223372036854775808.0 && number < 9223372036854775808.0)) return false;
    out = static_cast<int64_t>(number);
    return true;
  }
  if (integer.is_number_unsigned() &&
      integer.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  out = integer.get<int64_t>();
  return true;
}

// Reads the fields of one JSON object, remembering which were read so that the rest can be
// reported as unrecognized.
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  std::string param(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // The value of `key`, or nullptr when it is absent or null.
  const Json* get(std::string_view key) {
    read_.insert(std::string(key));
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const Json& require(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) fail("Missing required parameter: '" + param(key) + "'.", param(key));
    return *value;
  }

  std::optional<bool> boolean(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) fail_type(param(key), "a boolean", *value);
    return value->get<bool>();
  }

  std::optional<std::string> string(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) fail_type(param(key), "a string", *value);
    return value->get<std::string>();
  }

  // A finite number in [min, max]; `allowed` describes the range for the message.
  std::optional<double> number(std::string_view key, double min, double max, const char* allowed) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) fail_type(param(key), "a number", *value);
    double number = value->get<double>();
    if (!(std::isfinite(number) && number >= min && number <= max)) {
      fail("Invalid value for '" + param(key) + "': " + number_text(number) +
               " is out of range (allowed: " + allowed + ").",
           param(key));
    }
    return number;
  }

  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max,
                                 const char* allowed) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    return checked_integer(*value, param(key), min, max, allowed);
  }

  // Fields that were not read: a 400 naming the first.
  void reject_unread() const {
    for (const std::string& key : unread()) {
      fail("Unrecognized request argument supplied: " + param(key), param(key));
    }
  }

  std::vector<std::string> unread() const {
    std::vector<std::string> keys;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!read_.contains(it.key())) keys.push_back(it.key());
    }
    return keys;
  }

  static int64_t checked_integer(const Json& value, const std::string& param, int64_t min,
                                 int64_t max, const char* allowed) {
    if (!is_integral(value)) fail_type(param, "an integer", value);
    int64_t number = 0;
    bool in_range = fits_int64(value, number) && number >= min && number <= max;
    if (!in_range) {
      fail("Invalid value for '" + param + "': " + value.dump() +
               " is out of range (allowed: " + allowed + ").",
           param);
    }
    return number;
  }

 private:
  const Json& object_;
  std::string path_;
  std::set<std::string, std::less<>> read_;
};

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

int32_t token_id(const Json& value, const std::string& param, int vocab_size) {
  if (!is_integral(value)) fail_type(param, "an integer token id", value);
  int64_t id = 0;
  if (!fits_int64(value, id) || id < 0 || id >= vocab_size) {
    fail("Invalid value for '" + param + "': token id " + value.dump() +
             " is outside the vocabulary [0, " + std::to_string(vocab_size) + ").",
         param);
  }
  return static_cast<int32_t>(id);
}

std::vector<int32_t> token_ids(const Json& array, const std::string& param, int vocab_size) {
  if (array.empty()) fail("Invalid value for '" + param + "': the prompt is empty.", param);
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    ids.push_back(token_id(array[i], param + "[" + std::to_string(i) + "]", vocab_size));
  }
  return ids;
}

std::vector<Prompt> read_prompts(const Json& prompt, int vocab_size) {
  constexpr const char* kShapes =
      "a string, an array of strings, an array of token ids, or an array of token-id arrays";
  auto text_prompt = [](const Json& value, const std::string& param) {
    if (value.get_ref<const std::string&>().empty()) {
      fail("Invalid value for '" + param + "': the prompt is empty.", param);
    }
    return Prompt{value.get<std::string>(), {}, false};
  };
  if (prompt.is_string()) return {text_prompt(prompt, "prompt")};
  if (!prompt.is_array()) fail_type("prompt", kShapes, prompt);
  if (prompt.empty()) fail("Invalid value for 'prompt': the list of prompts is empty.", "prompt");
  const Json& first = prompt[0];
  if (is_integral(first)) return {Prompt{{}, token_ids(prompt, "prompt", vocab_size), true}};
  if (!first.is_string() && !first.is_array()) fail_type("prompt", kShapes, prompt);
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < prompt.size(); ++i) {
    std::string param = "prompt[" + std::to_string(i) + "]";
    const Json& item = prompt[i];
    bool same_kind = first.is_string() ? item.is_string() : item.is_array();
    if (!same_kind)
      fail_type(param, first.is_string() ? "a string" : "an array of token ids", item);
    if (item.is_string()) {
      prompts.push_back(text_prompt(item, param));
    } else {
      prompts.push_back(Prompt{{}, token_ids(item, param, vocab_size), true});
    }
  }
  return prompts;
}

std::vector<std::string> read_stop(ObjectReader& reader) {
  const Json* stop = reader.get("stop");
  if (stop == nullptr) return {};
  auto check = [](const Json& value, const std::string& param) {
    if (!value.is_string()) fail_type(param, "a string", value);
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty())
      fail("Invalid value for '" + param + "': stop strings must not be empty.", param);
    if (text.size() > kMaxStopStringBytes) {
      fail("Invalid value for '" + param + "': a stop string may be at most " +
               std::to_string(kMaxStopStringBytes) + " bytes long.",
           param);
    }
    return text;
  };
  if (stop->is_string()) return {check(*stop, "stop")};
  if (!stop->is_array()) fail_type("stop", "a string or an array of strings", *stop);
  if (stop->size() > static_cast<size_t>(kMaxStopStrings)) {
    fail("Invalid value for 'stop': at most " + std::to_string(kMaxStopStrings) +
             " stop strings are allowed, got " + std::to_string(stop->size()) + ".",
         "stop");
  }
  std::vector<std::string> stops;
  for (size_t i = 0; i < stop->size(); ++i) {
    stops.push_back(check((*stop)[i], "stop[" + std::to_string(i) + "]"));
  }
  return stops;
}

// {"token id": bias}: keys are decimal token ids in the vocabulary, biases numbers in
// [-100, 100] (OpenAI's range; vLLM clamps instead, which would hide a client's mistake).
void read_logit_bias(ObjectReader& reader, SamplingParams& sampling, int vocab_size) {
  const Json* bias = reader.get("logit_bias");
  if (bias == nullptr) return;
  if (!bias->is_object()) fail_type("logit_bias", "an object", *bias);
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::string& key = it.key();
    const std::string param = "logit_bias." + key;
    const bool decimal = !key.empty() && key.size() <= 10 &&
                         std::ranges::all_of(key, [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = decimal ? std::stoll(key) : -1;
    if (id < 0 || id >= vocab_size) {
      fail("Invalid key in 'logit_bias': \"" + key + "\" is not a token id in [0, " +
               std::to_string(vocab_size) + ").",
           "logit_bias");
    }
    if (!it->is_number()) fail_type(param, "a number", *it);
    const double value = it->get<double>();
    if (!(value >= -kMaxLogitBias && value <= kMaxLogitBias)) {
      fail("Invalid value for '" + param + "': " + number_text(value) +
               " is out of range (allowed: [-100, 100]).",
           param);
    }
    // "7" and "007" name the same token: the later one wins, as in a Python dict of ints.
    std::erase_if(sampling.logit_bias,
                  [&](const LogitBias& entry) { return entry.token == static_cast<int32_t>(id); });
    sampling.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(value)});
  }
}

// OpenAI fields that are accepted, type-checked and otherwise ignored (docs/API.md, "Request
// fields"): they change nothing about the generation here (store, metadata, service_tier:
// OpenAI's platform; priority: vLLM's priority scheduling, not implemented; reasoning_effort:
// Qwen3 thinks or not, which chat_template_kwargs.enable_thinking sets).
void read_accepted_openai_fields(ObjectReader& reader) {
  reader.boolean("store");
  reader.string("reasoning_effort");
  reader.string("service_tier");
  reader.integer("priority", std::numeric_limits<int64_t>::min(),
                 std::numeric_limits<int64_t>::max(), "a 64-bit integer");
  if (const Json* metadata = reader.get("metadata")) {
    if (!metadata->is_object()) fail_type("metadata", "an object", *metadata);
    for (auto it = metadata->begin(); it != metadata->end(); ++it) {
      if (!it->is_string()) fail_type("metadata." + it.key(), "a string", *it);
    }
  }
}

// The fields shared by both endpoints: sampling, stop conditions, n, streaming, user, model.
void read_common_fields(ObjectReader& reader, GenerationRequest& request, int vocab_size) {
  if (auto model = reader.string("model")) request.model = *model;
  SamplingParams& sampling = request.sampling;
  SamplingDefaults& requested = request.requested_defaults;
  constexpr double kHuge = std::numeric_limits<double>::max();
  if (auto v = reader.number("temperature", 0.0, kHuge, "a finite number >= 0")) {
    requested.temperature = static_cast<float>(*v);
  }
  if (auto v = reader.number("top_p", 0.0, 1.0, "(0, 1]")) {
    if (*v == 0.0) fail("Invalid value for 'top_p': 0 is out of range (allowed: (0, 1]).", "top_p");
    requested.top_p = static_cast<float>(*v);
  }
  if (auto v = reader.integer("top_k", -1, kIntMax, "-1, 0 (disabled) or a positive integer")) {
    requested.top_k = static_cast<int>(*v);
  }
  if (auto v = reader.number("min_p", 0.0, 1.0, "[0, 1]")) requested.min_p = static_cast<float>(*v);
  if (auto v = reader.number("repetition_penalty", 0.0, kHuge, "a finite number > 0")) {
    if (*v == 0.0) {
      fail(
          "Invalid value for 'repetition_penalty': 0 is out of range (allowed: a finite number "
          "> 0).",
          "repetition_penalty");
    }
    requested.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = reader.number("presence_penalty", -2.0, 2.0, "[-2, 2]")) {
    sampling.presence_penalty = static_cast<float>(*v);
  }
  if (auto v = reader.number("frequency_penalty", -2.0, 2.0, "[-2, 2]")) {
    sampling.frequency_penalty = static_cast<float>(*v);
  }
  if (const Json* seed = reader.get("seed")) {
    // Any 64-bit integer; negative seeds are taken modulo 2^64.
    int64_t value = 0;
    if (seed->is_number_unsigned()) {
      sampling.seed = seed->get<uint64_t>();
    } else if (is_integral(*seed) && fits_int64(*seed, value)) {
      sampling.seed = static_cast<uint64_t>(value);
    } else {
      fail_type("seed", "an integer", *seed);
    }
  }
  if (auto v = reader.integer("min_tokens", 0, kIntMax, ">= 0")) {
    sampling.min_tokens = static_cast<int>(*v);
  }
  if (auto v = reader.boolean("ignore_eos")) sampling.ignore_eos = *v;
  if (const Json* ids = reader.get("stop_token_ids")) {
    if (!ids->is_array()) fail_type("stop_token_ids", "an array of token ids", *ids);
    for (size_t i = 0; i < ids->size(); ++i) {
      sampling.stop_token_ids.push_back(
          token_id((*ids)[i], "stop_token_ids[" + std::to_string(i) + "]", vocab_size));
    }
  }
  request.stop = read_stop(reader);
  if (auto v = reader.boolean("include_stop_str_in_output"))
    request.include_stop_str_in_output = *v;
  if (auto v = reader.boolean("skip_special_tokens")) request.skip_special_tokens = *v;
  if (auto v = reader.integer("n", 1, kMaxChoices, "1 to 128")) request.n = static_cast<int>(*v);
  if (auto v = reader.boolean("stream")) request.stream = *v;
  if (const Json* options = reader.get("stream_options")) {
    if (!options->is_object()) fail_type("stream_options", "an object", *options);
    if (!request.stream) {
      fail("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
           "stream_options");
    }
    ObjectReader option_reader(*options, "stream_options");
    if (auto v = option_reader.boolean("include_usage")) request.include_usage = *v;
    if (auto v = option_reader.boolean("continuous_usage_stats")) {
      request.continuous_usage_stats = *v;
    }
    option_reader.reject_unread();
  }
  if (auto v = reader.string("user")) request.user = *v;
  read_logit_bias(reader, sampling, vocab_size);
  read_accepted_openai_fields(reader);
}

void read_max_tokens(ObjectReader& reader, std::string_view key, GenerationRequest& request) {
  if (auto v = reader.integer(key, 1, kIntMax, ">= 1")) request.max_tokens = static_cast<int>(*v);
}

// Content as the chat template expects it: a string, with text parts joined by "\n".
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
void set_structured_output(GenerationRequest& request, StructuredOutput output,
                           const std::string& param, std::optional<std::string>& source) {
  if (source) {
    fail("'" + param + "' and '" + *source + "' both constrain the output; give only one.",
         param);
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
        fail_type("response_format.json_schema.name", "a string",
                  *schema_reader.get("name"));
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
    fail("'tool_choice' forces a tool call, which cannot be combined with another structured "
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

// Runs a parser body, turning its RequestError (or an allocation failure) into an ApiError.
template <typename T, typename Fn>
ApiResult<T> capture_api_error(Fn&& fn) {
  try {
    return fn();
  } catch (const RequestError& e) {
    return e.error;
  } catch (const std::bad_alloc&) {
    return internal_server_error("out of memory while parsing the request");
  } catch (const std::exception& e) {
    return internal_server_error(std::string("while parsing the request: ") + e.what());
  }
}

// Unknown top-level fields: a 400 in strict mode; otherwise ignored and listed for the server's
// log line, as vLLM does, so that clients on newer SDKs keep working.
void finish_top_level(const ObjectReader& reader, GenerationRequest& request, bool strict_fields) {
  if (strict_fields) {
    reader.reject_unread();
  } else {
    request.ignored_fields = reader.unread();
  }
}

void require_object(const Json& body) {
  if (!body.is_object()) {
    fail("The request body must be a JSON object, got " + type_name(body) + ".", "");
  }
}

}  // namespace

ApiResult<nlohmann::ordered_json> parse_json_body(std::string_view body) {
  if (Status depth = check_json_depth(body, "The request body"); !depth.ok()) {
    return invalid_request(depth.message() + ".");
  }
  Json parsed;
  try {
    parsed = Json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_request(
        "We could not parse the JSON body of your request: invalid JSON at byte " +
        std::to_string(e.byte) + ".");
  } catch (const nlohmann::json::exception& e) {
    // e.g. a number too large for a double ("1e400").
    return invalid_request(std::string("We could not parse the JSON body of your request: ") +
                           e.what());
  }
  if (!parsed.is_object()) {
    return invalid_request("The request body must be a JSON object, got " + type_name(parsed) +
                           ".");
  }
  return parsed;
}

ApiResult<GenerationRequest> parse_completion_request(const nlohmann::ordered_json& body,
                                                      int vocab_size, bool strict_fields) {
  return capture_api_error<GenerationRequest>([&]() -> GenerationRequest {
    require_object(body);
    GenerationRequest request;
    request.endpoint = ApiEndpoint::kCompletions;
    ObjectReader reader(body, "");
    request.prompts = read_prompts(reader.require("prompt"), vocab_size);
    read_common_fields(reader, request, vocab_size);
    read_max_tokens(reader, "max_tokens", request);
    if (auto v = reader.integer("logprobs", 0, kMaxLogprobs, "0 to 20")) {
      request.sampling.want_logprobs = true;
      request.sampling.logprobs = static_cast<int>(*v);
    }
    if (auto v = reader.boolean("echo")) request.echo = *v;
    read_structured_output(reader, request);
    reader.integer("best_of", 1, 1, "1 (best_of is not supported)");
    if (reader.get("suffix") != nullptr)
      fail("'suffix' is not supported by this server.", "suffix");
    finish_top_level(reader, request, strict_fields);
    return request;
  });
}

ApiResult<GenerationRequest> parse_chat_completion_request(const nlohmann::ordered_json& body,
                                                           int vocab_size, bool strict_fields) {
  return capture_api_error<GenerationRequest>([&]() -> GenerationRequest {
    require_object(body);
    GenerationRequest request;
    request.endpoint = ApiEndpoint::kChatCompletions;
    ObjectReader reader(body, "");
    const Json& messages = reader.require("messages");
    if (!messages.is_array()) fail_type("messages", "an array", messages);
    if (messages.empty()) fail("Invalid value for 'messages': the list is empty.", "messages");
    for (size_t i = 0; i < messages.size(); ++i) {
      request.messages.push_back(read_message(messages[i], "messages[" + std::to_string(i) + "]"));
    }
    read_common_fields(reader, request, vocab_size);
    read_max_tokens(reader, "max_tokens", request);
    read_max_tokens(reader, "max_completion_tokens", request);  // wins over max_tokens
    bool logprobs = reader.boolean("logprobs").value_or(false);
    auto top_logprobs = reader.integer("top_logprobs", 0, kMaxLogprobs, "0 to 20");
    if (top_logprobs && !logprobs) {
      fail("Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.",
           "top_logprobs");
    }
    request.sampling.want_logprobs = logprobs;
    request.sampling.logprobs = static_cast<int>(top_logprobs.value_or(0));
    if (const Json* tools = reader.get("tools")) request.tools = read_tools(*tools);
    read_tool_choice(reader, request);
    reader.boolean("parallel_tool_calls");
    read_chat_template_kwargs(reader, request);
    read_chat_prompt_shape(reader, request);
    read_structured_output(reader, request);
    constrain_tool_calls(request);
    finish_top_level(reader, request, strict_fields);
    return request;
  });
}

bool GenerationRequest::parses_tool_calls() const {
  return tools.is_array() && !tools.empty() && tool_choice != "none";
}

ApiResult<TokenizeRequest> parse_tokenize_request(const nlohmann::ordered_json& body,
                                                  int vocab_size, bool strict_fields) {
  return capture_api_error<TokenizeRequest>([&]() -> TokenizeRequest {
    require_object(body);
    TokenizeRequest request;
    Json rest = body;
    ObjectReader reader(body, "");
    if (auto v = reader.boolean("return_token_strs")) request.return_token_strs = *v;
    reader.boolean("add_special_tokens");
    for (const char* own : {"return_token_strs", "add_special_tokens"}) rest.erase(own);
    if (body.contains("messages")) {
      if (body.contains("prompt")) {
        fail("Give either 'prompt' or 'messages', not both.", "prompt");
      }
      ApiResult<GenerationRequest> chat =
          parse_chat_completion_request(rest, vocab_size, strict_fields);
      if (!chat.ok()) throw RequestError{chat.error()};
      request.chat = std::move(chat).value();
      request.model = request.chat.model;
      request.ignored_fields = request.chat.ignored_fields;
      return request;
    }
    if (auto model = reader.string("model")) request.model = *model;
    const Json& prompt = reader.require("prompt");
    if (!prompt.is_string()) fail_type("prompt", "a string", prompt);
    request.prompt = prompt.get<std::string>();
    if (strict_fields) {
      reader.reject_unread();
    } else {
      request.ignored_fields = reader.unread();
    }
    return request;
  });
}

ApiResult<DetokenizeRequest> parse_detokenize_request(const nlohmann::ordered_json& body,
                                                      int vocab_size, bool strict_fields) {
  return capture_api_error<DetokenizeRequest>([&]() -> DetokenizeRequest {
    require_object(body);
    DetokenizeRequest request;
    ObjectReader reader(body, "");
    if (auto model = reader.string("model")) request.model = *model;
    const Json& tokens = reader.require("tokens");
    if (!tokens.is_array()) fail_type("tokens", "an array of token ids", tokens);
    for (size_t i = 0; i < tokens.size(); ++i) {
      request.tokens.push_back(
          token_id(tokens[i], "tokens[" + std::to_string(i) + "]", vocab_size));
    }
    if (strict_fields) {
      reader.reject_unread();
    } else {
      request.ignored_fields = reader.unread();
    }
    return request;
  });
}

ApiResult<SamplingParams> GenerationRequest::resolved_sampling(
    const SamplingDefaults& generation_config, int resolved_max_tokens, int vocab_size) const {
  SamplingParams params =
      resolve_sampling_defaults(sampling, requested_defaults, generation_config);
  params.max_tokens = resolved_max_tokens;
  Status valid = params.validate(vocab_size);
  if (!valid.ok()) return invalid_request(valid.message());
  return params;
}

ApiResult<int> resolve_max_tokens(const GenerationRequest& request, int prompt_tokens,
                                  int max_model_len) {
  bool chat = request.endpoint == ApiEndpoint::kChatCompletions;
  std::string prompt_param = chat ? "messages" : "prompt";
  std::string limit =
      "This model's maximum context length is " + std::to_string(max_model_len) + " tokens";
  if (prompt_tokens >= max_model_len) {
    ApiError error =
        invalid_request(limit + ". However, your request has " + std::to_string(prompt_tokens) +
                            " input tokens. Please reduce the length of the input.",
                        prompt_param);
    error.code = "context_length_exceeded";
    return error;
  }
  int room = max_model_len - prompt_tokens;
  int max_tokens = 0;
  if (request.max_tokens) {
    max_tokens = *request.max_tokens;
    if (max_tokens > room) {
      std::string param = chat ? "max_completion_tokens" : "max_tokens";
      ApiError error = invalid_request(
          "'" + param + "' is too large: " + std::to_string(max_tokens) + ". " + limit +
              " and your request has " + std::to_string(prompt_tokens) + " input tokens (" +
              std::to_string(max_tokens) + " > " + std::to_string(max_model_len) + " - " +
              std::to_string(prompt_tokens) + ").",
          param);
      error.code = "context_length_exceeded";
      return error;
    }
  } else {
    max_tokens = chat ? room : std::min(kDefaultCompletionMaxTokens, room);
  }
  if (request.sampling.min_tokens > max_tokens) {
    return invalid_request(
        "Invalid value for 'min_tokens': " + std::to_string(request.sampling.min_tokens) +
            " is larger than max_tokens (" + std::to_string(max_tokens) + ").",
        "min_tokens");
  }
  return max_tokens;
}

}  // namespace pdserve
