#include "common/protocol/openai_request.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/protocol/chat_request_fields.h"
#include "common/protocol/request_fields.h"
#include "common/protocol/structured_output_fields.h"

namespace pdserve {
namespace {

using namespace request_fields;

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
  // vLLM's prompt_logprobs (-1, the whole vocabulary, is not offered).
  if (auto v = reader.integer("prompt_logprobs", 0, kMaxLogprobs, "0 to 20")) {
    request.prompt_logprobs = static_cast<int>(*v);
    sampling.prompt_logprobs = static_cast<int>(*v);
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
  if (request.prompt_logprobs && request.stream) {
    fail("'prompt_logprobs' are not available when 'stream' is enabled.", "prompt_logprobs");
  }
  if (auto v = reader.string("user")) request.user = *v;
  read_logit_bias(reader, sampling, vocab_size);
  read_accepted_openai_fields(reader);
}

void read_max_tokens(ObjectReader& reader, std::string_view key, GenerationRequest& request) {
  if (auto v = reader.integer(key, 1, kIntMax, ">= 1")) request.max_tokens = static_cast<int>(*v);
}

// Content as the chat template expects it: a string, with text parts joined by "\n".
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
    // Echo with logprobs reports the prompt's tokens too: the engine computes their logprobs
    // with as many alternatives as either field asks.
    if (request.echo && request.sampling.want_logprobs) {
      request.sampling.prompt_logprobs =
          std::max(request.sampling.logprobs, request.prompt_logprobs.value_or(0));
    }
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
