// What a /v1/completions or /v1/chat/completions request becomes before any engine sees it:
// the body parsed (the OpenAI fields, the cluster-only stream resumption, the test-only scripted
// output), its prompts rendered and tokenized, the resumption checked against them. No engine,
// no connection: a refusal is an ApiError the server sends as it is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/chat/chat_template.h"
#include "common/engine/inference_service.h"
#include "common/http/http_message.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_request.h"
#include "common/protocol/stream_resume.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

// One prompt of the request: its tokens, echo text and whether output starts inside <think>.
struct PreparedPrompt {
  std::vector<int32_t> tokens;
  std::string echo;
  bool starts_in_reasoning = false;
};

struct PreparedGeneration {
  GenerationRequest request;
  std::vector<PreparedPrompt> prompts;  // each yields request.n choices
  // The proxy continues a stream another node started (cluster token only).
  std::optional<StreamResume> resume;
  // The proxy asked for stream checkpoints (X-Pdserve-Resumable with the cluster token).
  bool resumable = false;
  // Chat echo: the last message's content, written before each answer.
  std::string chat_echo;
  // Test only (OpenAiOptions::test_scripted_output): the output's first tokens.
  std::vector<int32_t> scripted_output;

  size_t num_choices() const { return prompts.size() * static_cast<size_t>(request.n); }
};

// What preparing a request needs of its server.
struct GenerationContext {
  const Tokenizer& tokenizer;
  const ChatTemplate& chat_template;
  const ModelInfo& model;
  bool strict_request_fields = false;
  bool test_scripted_output = false;
  std::string_view cluster_token;
};

ApiResult<PreparedGeneration> prepare_generation(const http::HttpRequest& request, bool chat,
                                                 const GenerationContext& context);

// One log line per request that had unknown top-level fields (vLLM logs them too).
void log_ignored_fields(const std::vector<std::string>& fields);

}  // namespace pdserve
