#include "common/api/anthropic_answer.h"

#include <tuple>
#include <utility>

#include "common/api/anthropic_error.h"
#include "common/api/anthropic_request.h"
#include "common/api/sse_framing.h"
#include "common/core/json_depth.h"

namespace pdserve::api {
namespace {

using Ordered = nlohmann::ordered_json;

std::string text_of(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string message_id(const nlohmann::json& chat) {
  const std::string id = text_of(chat, "id");
  return "msg_" + id.substr(id.find('-') + 1);
}

// The chat finish reason (and vLLM's stop_reason: the stop string that matched) as Anthropic's
// stop_reason and stop_sequence.
std::pair<std::string, Ordered> stop_of(const nlohmann::json& choice) {
  const std::string finish = text_of(choice, "finish_reason");
  if (finish == "length") return {"max_tokens", nullptr};
  if (finish == "tool_calls") return {"tool_use", nullptr};
  if (const auto it = choice.find("stop_reason"); it != choice.end() && it->is_string()) {
    return {"stop_sequence", *it};
  }
  return {"end_turn", nullptr};
}

// A call's arguments as the tool_use block's input: the JSON object the parser delivered.
Ordered tool_input(const std::string& arguments) {
  Result<nlohmann::json> parsed = parse_json_bounded(arguments, "tool call arguments");
  if (parsed.ok() && parsed->is_object()) return Ordered::parse(parsed->dump());
  return Ordered::object();
}

std::string dump(const Ordered& value) {
  return value.dump(-1, ' ', false, Ordered::error_handler_t::replace);
}

}  // namespace

http::HttpResponse AnthropicAnswer::whole(const nlohmann::json& completion) {
  const nlohmann::json choices = completion.value("choices", nlohmann::json::array());
  const nlohmann::json choice = choices.empty() ? nlohmann::json::object() : choices[0];
  const nlohmann::json message = choice.value("message", nlohmann::json::object());
  Ordered content = Ordered::array();
  if (const std::string reasoning = text_of(message, "reasoning_content"); !reasoning.empty()) {
    content.push_back({{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
  }
  const nlohmann::json calls = message.value("tool_calls", nlohmann::json::array());
  const std::string text = text_of(message, "content");
  if (!text.empty() || calls.empty()) content.push_back({{"type", "text"}, {"text", text}});
  for (const nlohmann::json& call : calls) {
    const nlohmann::json function = call.value("function", nlohmann::json::object());
    content.push_back({{"type", "tool_use"},
                       {"id", text_of(call, "id")},
                       {"name", text_of(function, "name")},
                       {"input", tool_input(text_of(function, "arguments"))}});
  }
  const auto [stop_reason, stop_sequence] = stop_of(choice);
  const nlohmann::json usage = completion.value("usage", nlohmann::json::object());
  Ordered out;
  out["id"] = message_id(completion);
  out["type"] = "message";
  out["role"] = "assistant";
  out["content"] = std::move(content);
  out["model"] = text_of(completion, "model");
  out["stop_reason"] = stop_reason;
  out["stop_sequence"] = stop_sequence;
  out["usage"] = {{"input_tokens", usage.value("prompt_tokens", int64_t{0})},
                  {"output_tokens", usage.value("completion_tokens", int64_t{0})}};
  return {200, "application/json", {}, dump(out)};
}

http::HttpResponse AnthropicAnswer::error(int status, const nlohmann::json& body) {
  const nlohmann::json error = body.value("error", nlohmann::json::object());
  std::string message = text_of(error, "message");
  if (const std::string param = text_of(error, "param"); !param.empty()) {
    const std::string named = messages_param(param);
    if (message.find(named) == std::string::npos) message = named + ": " + message;
  }
  return {status, "application/json", {}, dump(anthropic_error_body(status, message))};
}

std::string AnthropicAnswer::start(const nlohmann::json& chunk) {
  if (started_) return {};
  started_ = true;
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    input_tokens_ = usage->value("prompt_tokens", int64_t{0});
  }
  Ordered message;
  message["id"] = message_id(chunk);
  message["type"] = "message";
  message["role"] = "assistant";
  message["content"] = Ordered::array();
  message["model"] = text_of(chunk, "model");
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  message["usage"] = {{"input_tokens", input_tokens_}, {"output_tokens", 0}};
  return named_sse_event("message_start", {{"type", "message_start"}, {"message", message}});
}

std::string AnthropicAnswer::open_block(BlockKind kind, const Ordered& content_block) {
  if (open_ == kind && kind != BlockKind::kToolUse) return {};
  std::string out = close_block();
  open_ = kind;
  open_index_ = next_block_++;
  return out + named_sse_event("content_block_start", {{"type", "content_block_start"},
                                                       {"index", *open_index_},
                                                       {"content_block", content_block}});
}

std::string AnthropicAnswer::close_block() {
  if (!open_) return {};
  open_.reset();
  return named_sse_event("content_block_stop",
                         {{"type", "content_block_stop"}, {"index", *open_index_}});
}

std::string AnthropicAnswer::delta(const Ordered& payload) {
  return named_sse_event(
      "content_block_delta",
      {{"type", "content_block_delta"}, {"index", *open_index_}, {"delta", payload}});
}

std::string AnthropicAnswer::chunk(const nlohmann::json& chunk) {
  if (ended_) return {};
  std::string out = start(chunk);
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    output_tokens_ = usage->value("completion_tokens", output_tokens_);
    input_tokens_ = usage->value("prompt_tokens", input_tokens_);
  }
  const nlohmann::json choices = chunk.value("choices", nlohmann::json::array());
  if (choices.empty() || !choices[0].is_object()) return out;
  const nlohmann::json& choice = choices[0];
  const nlohmann::json delta_in = choice.value("delta", nlohmann::json::object());
  if (const std::string thinking = text_of(delta_in, "reasoning_content"); !thinking.empty()) {
    out += open_block(BlockKind::kThinking,
                      {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    out += delta({{"type", "thinking_delta"}, {"thinking", thinking}});
  }
  if (const std::string text = text_of(delta_in, "content"); !text.empty()) {
    out += open_block(BlockKind::kText, {{"type", "text"}, {"text", ""}});
    out += delta({{"type", "text_delta"}, {"text", text}});
  }
  for (const nlohmann::json& call : delta_in.value("tool_calls", nlohmann::json::array())) {
    const nlohmann::json function = call.value("function", nlohmann::json::object());
    if (call.contains("id")) {
      out += open_block(BlockKind::kToolUse, {{"type", "tool_use"},
                                              {"id", text_of(call, "id")},
                                              {"name", text_of(function, "name")},
                                              {"input", Ordered::object()}});
    }
    // A call's arguments follow its header: they belong to the open tool_use block.
    const std::string arguments = text_of(function, "arguments");
    if (!arguments.empty() && open_ == BlockKind::kToolUse) {
      out += delta({{"type", "input_json_delta"}, {"partial_json", arguments}});
    }
  }
  if (const auto finish = choice.find("finish_reason");
      finish != choice.end() && finish->is_string()) {
    std::tie(stop_reason_, stop_sequence_) = stop_of(choice);
    out += close_block();
  }
  return out;
}

std::string AnthropicAnswer::stream_error(const nlohmann::json& body) {
  if (ended_) return {};
  ended_ = true;
  const nlohmann::json error = body.value("error", nlohmann::json::object());
  const std::string type = text_of(error, "type");
  // A stream's status is 200: the error's kind says which Anthropic error it is.
  const int status = type == "invalid_request_error" ? 400 : type == "rate_limit_error" ? 429 : 500;
  return named_sse_event("error", anthropic_error_body(status, text_of(error, "message")));
}

std::string AnthropicAnswer::done() {
  if (ended_) return {};
  ended_ = true;
  std::string out = close_block();
  Ordered message_delta;
  message_delta["type"] = "message_delta";
  message_delta["delta"] = {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}};
  message_delta["usage"] = {{"input_tokens", input_tokens_}, {"output_tokens", output_tokens_}};
  return out + named_sse_event("message_delta", message_delta) +
         named_sse_event("message_stop", {{"type", "message_stop"}});
}

}  // namespace pdserve::api
