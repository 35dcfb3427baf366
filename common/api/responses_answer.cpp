#include "common/api/responses_answer.h"

#include <utility>

#include "common/api/responses_request.h"
#include "common/api/sse_framing.h"

namespace pdserve::api {
namespace {

using Ordered = nlohmann::ordered_json;

constexpr int64_t kMaxCallIndex = 1023;

std::string text_of(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Ordered usage_json(const nlohmann::json& usage) {
  if (!usage.is_object()) return nullptr;
  const int64_t input = usage.value("prompt_tokens", int64_t{0});
  const int64_t output = usage.value("completion_tokens", int64_t{0});
  Ordered out;
  out["input_tokens"] = input;
  out["input_tokens_details"] = {{"cached_tokens", 0}};
  out["output_tokens"] = output;
  out["output_tokens_details"] = {{"reasoning_tokens", 0}};
  out["total_tokens"] = input + output;
  return out;
}

Ordered failure(const nlohmann::json& body) {
  const nlohmann::json error = body.value("error", nlohmann::json::object());
  return {{"code", error.value("code", nlohmann::json(nullptr)).is_string()
                       ? error["code"].get<std::string>()
                       : std::string("server_error")},
          {"message", text_of(error, "message")}};
}

}  // namespace

void ResponsesAnswer::take_meta(const nlohmann::json& chat) {
  const std::string id = text_of(chat, "id");
  if (!id.empty()) {
    serial_ = id.substr(id.find('-') + 1);
    id_ = "resp_" + serial_;
  }
  created_at_ = chat.value("created", int64_t{0});
  model_ = text_of(chat, "model");
}

std::string ResponsesAnswer::item_id(ItemKind kind, const std::string& call_id) const {
  switch (kind) {
    case ItemKind::kReasoning:
      return "rs_" + serial_ + "_" + std::to_string(items_.size());
    case ItemKind::kMessage:
      return "msg_" + serial_ + "_" + std::to_string(items_.size());
    case ItemKind::kFunctionCall:
      return "fc_" + (call_id.starts_with("call_") ? call_id.substr(5) : call_id);
  }
  return {};
}

Ordered ResponsesAnswer::item_json(const Item& item, std::string_view status) {
  Ordered out;
  out["id"] = item.id;
  switch (item.kind) {
    case ItemKind::kReasoning:
      out["type"] = "reasoning";
      out["summary"] = Ordered::array();
      out["content"] = Ordered::array({{{"type", "reasoning_text"}, {"text", item.text}}});
      out["status"] = status;
      break;
    case ItemKind::kMessage:
      out["type"] = "message";
      out["status"] = status;
      out["role"] = "assistant";
      out["content"] = Ordered::array({{{"type", "output_text"},
                                        {"text", item.text},
                                        {"annotations", Ordered::array()},
                                        {"logprobs", Ordered::array()}}});
      break;
    case ItemKind::kFunctionCall:
      out["type"] = "function_call";
      out["status"] = status;
      out["call_id"] = item.call_id;
      out["name"] = item.name;
      out["arguments"] = item.text;
      break;
  }
  return out;
}

Ordered ResponsesAnswer::response_object(std::string_view status) const {
  Ordered out;
  out["id"] = id_;
  out["object"] = "response";
  out["created_at"] = created_at_;
  out["status"] = status;
  out["background"] = false;
  out["error"] = error_;
  out["incomplete_details"] = nullptr;
  if (status == "incomplete") out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  out["instructions"] = echo_.value("instructions", Ordered(nullptr));
  out["max_output_tokens"] = echo_.value("max_output_tokens", Ordered(nullptr));
  out["metadata"] = echo_.value("metadata", Ordered::object());
  out["model"] = model_;
  out["output"] = Ordered::array();
  // Items are in_progress, completed or incomplete (a failed response's too).
  const std::string_view item_status = status == "failed" ? std::string_view("incomplete") : status;
  for (const Item& item : items_) out["output"].push_back(item_json(item, item_status));
  out["parallel_tool_calls"] = echo_.value("parallel_tool_calls", Ordered(true));
  out["previous_response_id"] = nullptr;
  out["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  out["store"] = false;
  out["temperature"] = echo_.value("temperature", Ordered(nullptr));
  out["text"] = echo_.value("text", Ordered{{"format", {{"type", "text"}}}});
  out["tool_choice"] = echo_.value("tool_choice", Ordered("auto"));
  out["tools"] = echo_.value("tools", Ordered::array());
  out["top_p"] = echo_.value("top_p", Ordered(nullptr));
  out["truncation"] = "disabled";
  out["usage"] = usage_;
  out["user"] = echo_.value("user", Ordered(nullptr));
  return out;
}

http::HttpResponse ResponsesAnswer::whole(const nlohmann::json& completion) {
  take_meta(completion);
  const nlohmann::json choices = completion.value("choices", nlohmann::json::array());
  const nlohmann::json choice = choices.empty() ? nlohmann::json::object() : choices[0];
  const nlohmann::json message = choice.value("message", nlohmann::json::object());
  if (const std::string reasoning = text_of(message, "reasoning_content"); !reasoning.empty()) {
    items_.push_back({ItemKind::kReasoning, item_id(ItemKind::kReasoning, {}), reasoning, {}, {}});
  }
  const nlohmann::json calls = message.value("tool_calls", nlohmann::json::array());
  const std::string content = text_of(message, "content");
  if (!content.empty() || calls.empty()) {
    items_.push_back({ItemKind::kMessage, item_id(ItemKind::kMessage, {}), content, {}, {}});
  }
  for (const nlohmann::json& call : calls) {
    const std::string call_id = text_of(call, "id");
    const nlohmann::json function = call.value("function", nlohmann::json::object());
    items_.push_back({ItemKind::kFunctionCall, item_id(ItemKind::kFunctionCall, call_id),
                      text_of(function, "arguments"), call_id, text_of(function, "name")});
  }
  usage_ = usage_json(completion.value("usage", nlohmann::json()));
  const bool cut = text_of(choice, "finish_reason") == "length";
  return {200,
          "application/json",
          {},
          response_object(cut ? "incomplete" : "completed")
              .dump(-1, ' ', false, Ordered::error_handler_t::replace)};
}

http::HttpResponse ResponsesAnswer::error(int status, const nlohmann::json& body) {
  Ordered out = body;
  if (auto it = out.find("error"); it != out.end() && it->is_object()) {
    if (auto param = it->find("param"); param != it->end() && param->is_string()) {
      *param = responses_param(param->get<std::string>());
    }
  }
  return {
      status, "application/json", {}, out.dump(-1, ' ', false, Ordered::error_handler_t::replace)};
}

std::string ResponsesAnswer::event(std::string_view type, Ordered payload) {
  Ordered out;
  out["type"] = type;
  out["sequence_number"] = sequence_++;
  for (auto it = payload.begin(); it != payload.end(); ++it) out[it.key()] = std::move(it.value());
  return named_sse_event(type, out);
}

std::string ResponsesAnswer::start() {
  if (started_) return {};
  started_ = true;
  std::string out = event("response.created", {{"response", response_object("in_progress")}});
  return out + event("response.in_progress", {{"response", response_object("in_progress")}});
}

std::string ResponsesAnswer::open_item(ItemKind kind, std::string call_id, std::string name) {
  if (open_ && items_[*open_].kind == kind && kind != ItemKind::kFunctionCall) return {};
  std::string out = close_item();
  const size_t index = items_.size();
  items_.push_back({kind, item_id(kind, call_id), {}, std::move(call_id), std::move(name)});
  open_ = index;
  const Item& item = items_.back();
  out += event("response.output_item.added",
               {{"output_index", index}, {"item", item_json(item, "in_progress")}});
  if (kind == ItemKind::kMessage) {
    out += event("response.content_part.added",
                 {{"item_id", item.id},
                  {"output_index", index},
                  {"content_index", 0},
                  {"part", item_json(item, "in_progress")["content"][0]}});
  }
  return out;
}

std::string ResponsesAnswer::close_item() {
  if (!open_) return {};
  const size_t index = *open_;
  open_.reset();
  const Item& item = items_[index];
  std::string out;
  switch (item.kind) {
    case ItemKind::kReasoning:
      out += event("response.reasoning_text.done", {{"item_id", item.id},
                                                    {"output_index", index},
                                                    {"content_index", 0},
                                                    {"text", item.text}});
      break;
    case ItemKind::kMessage: {
      const Ordered part = item_json(item, "completed")["content"][0];
      out += event("response.output_text.done", {{"item_id", item.id},
                                                 {"output_index", index},
                                                 {"content_index", 0},
                                                 {"text", item.text},
                                                 {"logprobs", Ordered::array()}});
      out += event(
          "response.content_part.done",
          {{"item_id", item.id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
      break;
    }
    case ItemKind::kFunctionCall:
      out += event("response.function_call_arguments.done", {{"item_id", item.id},
                                                             {"output_index", index},
                                                             {"name", item.name},
                                                             {"arguments", item.text}});
      break;
  }
  out += event("response.output_item.done",
               {{"output_index", index}, {"item", item_json(item, "completed")}});
  return out;
}

std::string ResponsesAnswer::chunk(const nlohmann::json& chunk) {
  if (ended_) return {};
  if (!started_) take_meta(chunk);
  std::string out = start();
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    usage_ = usage_json(*usage);
  }
  const nlohmann::json choices = chunk.value("choices", nlohmann::json::array());
  if (choices.empty() || !choices[0].is_object()) return out;
  const nlohmann::json& choice = choices[0];
  const nlohmann::json delta = choice.value("delta", nlohmann::json::object());
  if (const std::string reasoning = text_of(delta, "reasoning_content"); !reasoning.empty()) {
    out += open_item(ItemKind::kReasoning);
    Item& item = items_[*open_];
    item.text += reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", item.id},
                                                   {"output_index", *open_},
                                                   {"content_index", 0},
                                                   {"delta", reasoning}});
  }
  if (const std::string content = text_of(delta, "content"); !content.empty()) {
    out += open_item(ItemKind::kMessage);
    Item& item = items_[*open_];
    item.text += content;
    out += event("response.output_text.delta", {{"item_id", item.id},
                                                {"output_index", *open_},
                                                {"content_index", 0},
                                                {"delta", content},
                                                {"logprobs", Ordered::array()}});
  }
  for (const nlohmann::json& call : delta.value("tool_calls", nlohmann::json::array())) {
    const int64_t call_index = call.value("index", int64_t{0});
    // The chat path numbers a choice's calls from 0; anything else is not a call of this answer.
    if (call_index < 0 || call_index > kMaxCallIndex) continue;
    const size_t slot = static_cast<size_t>(call_index);
    const nlohmann::json function = call.value("function", nlohmann::json::object());
    if (call.contains("id")) {
      out += open_item(ItemKind::kFunctionCall, text_of(call, "id"), text_of(function, "name"));
      if (call_items_.size() <= slot) call_items_.resize(slot + 1, items_.size());
      call_items_[slot] = *open_;
    }
    const std::string arguments = text_of(function, "arguments");
    if (arguments.empty() || slot >= call_items_.size() || call_items_[slot] >= items_.size()) {
      continue;
    }
    const size_t index = call_items_[slot];
    Item& item = items_[index];
    item.text += arguments;
    out += event("response.function_call_arguments.delta",
                 {{"item_id", item.id}, {"output_index", index}, {"delta", arguments}});
  }
  if (const auto finish = choice.find("finish_reason");
      finish != choice.end() && finish->is_string()) {
    finish_reason_ = finish->get<std::string>();
    out += close_item();
  }
  return out;
}

std::string ResponsesAnswer::stream_error(const nlohmann::json& body) {
  if (ended_) return {};
  std::string out = start();
  ended_ = true;
  error_ = failure(body);
  return out + event("response.failed", {{"response", response_object("failed")}});
}

std::string ResponsesAnswer::done() {
  if (ended_) return {};
  std::string out = start();
  out += close_item();
  ended_ = true;
  if (finish_reason_ == "length") {
    return out + event("response.incomplete", {{"response", response_object("incomplete")}});
  }
  return out + event("response.completed", {{"response", response_object("completed")}});
}

}  // namespace pdserve::api
