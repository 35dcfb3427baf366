#include "common/protocol/openai_response.h"

#include <cmath>

#include "common/tokenizer/utf8.h"

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;

double serialized_logprob(float logprob) {
  // NaN fails the comparison too.
  return logprob >= kMinSerializedLogprob ? static_cast<double>(logprob) : kMinSerializedLogprob;
}

// The token as a JSON string: itself when it is valid UTF-8, else "bytes:\xNN..." per byte.
std::string token_text(std::string_view token) {
  if (!tokenizer_detail::find_invalid_utf8(token)) return std::string(token);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text = "bytes:";
  for (unsigned char byte : token) {
    text += "\\x";
    text += kHex[byte >> 4];
    text += kHex[byte & 0xF];
  }
  return text;
}

Json token_bytes(std::string_view token) {
  Json bytes = Json::array();
  for (unsigned char byte : token) bytes.push_back(static_cast<int>(byte));
  return bytes;
}

int64_t code_points(std::string_view text) {
  int64_t count = 0;
  for (unsigned char byte : text) count += (byte & 0xC0) != 0x80;
  return count;
}

Json finish_reason_json(FinishReason reason) {
  if (reason == FinishReason::kNone) return nullptr;
  return std::string(finish_reason_name(reason));
}

Json chat_finish_reason_json(FinishReason reason, bool called_tools) {
  // An answer cut by max_tokens says so even after calls: its last call may be unfinished.
  return called_tools && reason != FinishReason::kLength ? Json("tool_calls")
                                                         : finish_reason_json(reason);
}

Json tool_calls_json(const std::vector<ChatToolCall>& calls) {
  Json json = Json::array();
  for (const ChatToolCall& call : calls) {
    Json item;
    item["id"] = call.id;
    item["type"] = "function";
    item["function"] = Json{{"name", call.name}, {"arguments", call.arguments}};
    json.push_back(std::move(item));
  }
  return json;
}

Json tool_call_deltas_json(const std::vector<ChatToolCallDelta>& calls) {
  Json json = Json::array();
  for (const ChatToolCallDelta& call : calls) {
    Json item;
    item["index"] = call.index;
    if (call.header) {
      item["id"] = call.header->id;
      item["type"] = "function";
      item["function"] = Json{{"name", call.header->name}, {"arguments", call.arguments}};
    } else {
      item["function"] = Json{{"arguments", call.arguments}};
    }
    json.push_back(std::move(item));
  }
  return json;
}

Json usage_json(const Usage& usage) {
  Json json;
  json["prompt_tokens"] = usage.prompt_tokens;
  json["completion_tokens"] = usage.completion_tokens;
  json["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  return json;
}

Json envelope(const ResponseMeta& meta, const char* object) {
  Json json;
  json["id"] = meta.id;
  json["object"] = object;
  json["created"] = meta.created;
  json["model"] = meta.model;
  return json;
}

Json chunk_envelope(const ResponseMeta& meta, const char* object, Json choice,
                    const StreamOptions& options) {
  Json json = envelope(meta, object);
  json["choices"] = Json::array({std::move(choice)});
  if (options.include_usage) json["usage"] = nullptr;
  return json;
}

Json optional_logprobs(const std::optional<std::vector<OutputTokenLogprob>>& logprobs,
                       int64_t text_offset_start) {
  if (!logprobs) return nullptr;
  return completion_logprobs_json(*logprobs, text_offset_start);
}

}  // namespace

Json completion_logprobs_json(const std::vector<OutputTokenLogprob>& tokens,
                              int64_t text_offset_start) {
  Json tokens_json = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json text_offset = Json::array();
  int64_t offset = text_offset_start;
  for (const OutputTokenLogprob& token : tokens) {
    tokens_json.push_back(token_text(token.token));
    text_offset.push_back(offset);
    offset += code_points(token.token);
    if (!token.logprob) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(serialized_logprob(*token.logprob));
    Json top = Json::object();
    for (const TopLogprob& alternative : token.top) {
      top[token_text(alternative.token)] = serialized_logprob(alternative.logprob);
    }
    top_logprobs.push_back(std::move(top));
  }
  Json json;
  json["tokens"] = std::move(tokens_json);
  json["token_logprobs"] = std::move(token_logprobs);
  json["top_logprobs"] = std::move(top_logprobs);
  json["text_offset"] = std::move(text_offset);
  return json;
}

Json chat_logprobs_json(const std::vector<OutputTokenLogprob>& tokens) {
  Json content = Json::array();
  for (const OutputTokenLogprob& token : tokens) {
    Json entry;
    entry["token"] = token_text(token.token);
    entry["logprob"] = serialized_logprob(token.logprob.value_or(-INFINITY));
    entry["bytes"] = token_bytes(token.token);
    Json top = Json::array();
    for (const TopLogprob& alternative : token.top) {
      Json item;
      item["token"] = token_text(alternative.token);
      item["logprob"] = serialized_logprob(alternative.logprob);
      item["bytes"] = token_bytes(alternative.token);
      top.push_back(std::move(item));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  Json json;
  json["content"] = std::move(content);
  return json;
}

Json completion_response(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices,
                         const Usage& usage) {
  Json json = envelope(meta, "text_completion");
  Json choices_json = Json::array();
  for (const CompletionChoice& choice : choices) {
    Json item;
    item["index"] = choice.index;
    item["text"] = choice.text;
    item["logprobs"] = optional_logprobs(choice.logprobs, choice.text_offset_start);
    item["finish_reason"] = finish_reason_json(choice.finish_reason);
    if (choice.prompt_logprobs)
      item["prompt_logprobs"] = prompt_logprobs_json(*choice.prompt_logprobs);
    choices_json.push_back(std::move(item));
  }
  json["choices"] = std::move(choices_json);
  json["usage"] = usage_json(usage);
  return json;
}

Json prompt_logprobs_json(const std::vector<PromptPositionLogprobs>& positions) {
  Json json = Json::array();
  json.push_back(nullptr);
  for (const PromptPositionLogprobs& position : positions) {
    Json entries = Json::object();
    for (const PromptPositionLogprobs::Entry& entry : position.entries) {
      entries[std::to_string(entry.token)] = {{"logprob", serialized_logprob(entry.logprob)},
                                              {"rank", entry.rank},
                                              {"decoded_token", entry.text}};
    }
    json.push_back(std::move(entries));
  }
  return json;
}

Json chat_completion_response(
    const ResponseMeta& meta, const std::vector<ChatChoice>& choices, const Usage& usage,
    const std::optional<std::vector<PromptPositionLogprobs>>& prompt_logprobs) {
  Json json = envelope(meta, "chat.completion");
  Json choices_json = Json::array();
  for (const ChatChoice& choice : choices) {
    Json message;
    const bool called_tools = !choice.tool_calls.empty();
    message["role"] = "assistant";
    message["content"] =
        called_tools && choice.content.empty() ? Json(nullptr) : Json(choice.content);
    if (choice.reasoning_content) message["reasoning_content"] = *choice.reasoning_content;
    if (called_tools) message["tool_calls"] = tool_calls_json(choice.tool_calls);
    Json item;
    item["index"] = choice.index;
    item["message"] = std::move(message);
    item["logprobs"] = choice.logprobs ? chat_logprobs_json(*choice.logprobs) : Json(nullptr);
    item["finish_reason"] = chat_finish_reason_json(choice.finish_reason, called_tools);
    if (!choice.matched_stop.empty()) item["stop_reason"] = choice.matched_stop;
    choices_json.push_back(std::move(item));
  }
  json["choices"] = std::move(choices_json);
  json["usage"] = usage_json(usage);
  if (prompt_logprobs) json["prompt_logprobs"] = prompt_logprobs_json(*prompt_logprobs);
  return json;
}

Json completion_chunk(const ResponseMeta& meta, const StreamOptions& options,
                      const CompletionChoice& choice) {
  Json item;
  item["index"] = choice.index;
  item["text"] = choice.text;
  item["logprobs"] = optional_logprobs(choice.logprobs, choice.text_offset_start);
  item["finish_reason"] = finish_reason_json(choice.finish_reason);
  return chunk_envelope(meta, "text_completion", std::move(item), options);
}

Json chat_role_chunk(const ResponseMeta& meta, const StreamOptions& options, int index) {
  Json item;
  item["index"] = index;
  item["delta"] = Json{{"role", "assistant"}, {"content", ""}};
  item["logprobs"] = nullptr;
  item["finish_reason"] = nullptr;
  return chunk_envelope(meta, "chat.completion.chunk", std::move(item), options);
}

Json chat_delta_chunk(const ResponseMeta& meta, const StreamOptions& options, int index,
                      std::string_view reasoning, std::string_view content,
                      const std::vector<OutputTokenLogprob>* logprobs,
                      const std::vector<ChatToolCallDelta>& tool_calls) {
  Json delta = Json::object();
  if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
  if (!content.empty()) delta["content"] = content;
  if (!tool_calls.empty()) delta["tool_calls"] = tool_call_deltas_json(tool_calls);
  Json item;
  item["index"] = index;
  item["delta"] = std::move(delta);
  item["logprobs"] = logprobs != nullptr ? chat_logprobs_json(*logprobs) : Json(nullptr);
  item["finish_reason"] = nullptr;
  return chunk_envelope(meta, "chat.completion.chunk", std::move(item), options);
}

Json chat_finish_chunk(const ResponseMeta& meta, const StreamOptions& options, int index,
                       FinishReason reason, bool called_tools, std::string_view matched_stop) {
  Json item;
  item["index"] = index;
  item["delta"] = Json::object();
  item["logprobs"] = nullptr;
  item["finish_reason"] = chat_finish_reason_json(reason, called_tools);
  if (!matched_stop.empty()) item["stop_reason"] = matched_stop;
  return chunk_envelope(meta, "chat.completion.chunk", std::move(item), options);
}

Json usage_chunk(const ResponseMeta& meta, bool chat, const Usage& usage) {
  Json json = envelope(meta, chat ? "chat.completion.chunk" : "text_completion");
  json["choices"] = Json::array();
  json["usage"] = usage_json(usage);
  return json;
}

std::string to_json_text(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string sse_event(const Json& payload) {
  return "data: " + to_json_text(payload) + "\n\n";
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

}  // namespace pdserve
