// A chat completion's answer as the Messages API's: the message {id "msg_...", type, role,
// content blocks (thinking from the reasoning, text, tool_use with the parsed arguments as
// `input`), model, stop_reason (end_turn; stop_sequence with the matched stop_sequence;
// max_tokens; tool_use), usage}, and for streams Anthropic's event sequence: message_start,
// per block content_block_start, content_block_delta (text_delta, thinking_delta,
// input_json_delta) ..., content_block_stop, then message_delta (stop_reason, usage) and
// message_stop; an `error` event when the chat stream failed. Errors are Anthropic's shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/api/chat_answer_translator.h"

namespace pdserve::api {

class AnthropicAnswer final : public ChatAnswerTranslator {
 public:
  http::HttpResponse whole(const nlohmann::json& completion) override;
  http::HttpResponse error(int status, const nlohmann::json& body) override;
  std::string chunk(const nlohmann::json& chunk) override;
  std::string stream_error(const nlohmann::json& body) override;
  std::string done() override;

 private:
  enum class BlockKind { kThinking, kText, kToolUse };

  std::string start(const nlohmann::json& chunk);
  // Starts a block of `kind` (stopping the open one) unless that kind is open.
  std::string open_block(BlockKind kind, const nlohmann::ordered_json& content_block);
  std::string close_block();
  std::string delta(const nlohmann::ordered_json& payload);

  int next_block_ = 0;
  std::optional<BlockKind> open_;
  std::optional<int> open_index_;
  int64_t input_tokens_ = 0;
  int64_t output_tokens_ = 0;
  std::string stop_reason_ = "end_turn";
  nlohmann::ordered_json stop_sequence_ = nullptr;
  bool started_ = false;
  bool ended_ = false;
};

}  // namespace pdserve::api
