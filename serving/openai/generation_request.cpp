#include "serving/openai/generation_request.h"

#include <algorithm>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/log.h"
#include "common/protocol/chat_prompt.h"
#include "common/protocol/pdserve_headers.h"
#include "common/protocol/reasoning_parser.h"

namespace pdserve {
namespace {

ApiResult<std::vector<PreparedPrompt>> prepare_prompts(const GenerationRequest& req, bool chat,
                                                       const GenerationContext& context) {
  std::vector<PreparedPrompt> prompts;
  if (chat) {
    ApiResult<std::string> text = render_chat_prompt(req, context.chat_template);
    if (!text.ok()) return text.error();
    Result<std::vector<int32_t>> tokens = context.tokenizer.encode(text.value());
    if (!tokens.ok()) return api_error_from_status(tokens.status());
    prompts.push_back({std::move(tokens).value(), "", prompt_ends_in_reasoning(text.value())});
    return prompts;
  }
  for (const Prompt& prompt : req.prompts) {
    PreparedPrompt prepared;
    if (prompt.is_token_ids) {
      prepared.tokens = prompt.token_ids;
      if (req.echo) {
        Result<std::string> text = context.tokenizer.decode(prompt.token_ids, false);
        if (!text.ok()) return invalid_request(text.status().message(), "prompt");
        prepared.echo = std::move(text).value();
      }
    } else {
      Result<std::vector<int32_t>> tokens = context.tokenizer.encode(prompt.text);
      if (!tokens.ok()) return invalid_request(tokens.status().message(), "prompt");
      prepared.tokens = std::move(tokens).value();
      prepared.echo = req.echo ? prompt.text : "";
    }
    if (prepared.tokens.empty()) return invalid_request("The prompt is empty.", "prompt");
    prompts.push_back(std::move(prepared));
  }
  return prompts;
}

// Stream resumption (common/protocol/stream_resume.h): between the proxy and its nodes only,
// for streams (any number of choices).
ApiResult<StreamResume> parse_resume(const nlohmann::json& field, const GenerationRequest& req,
                                     size_t num_choices) {
  if (!req.stream) {
    return invalid_request(std::string(kStreamResumeField) + " continues a streamed request",
                           kStreamResumeField);
  }
  Result<StreamResume> parsed = StreamResume::parse(field);
  if (!parsed.ok()) return invalid_request(parsed.status().message(), kStreamResumeField);
  StreamResume resume = std::move(parsed).value();
  if (resume.choices.size() != num_choices) {
    return invalid_request(std::string(kStreamResumeField) + " has " +
                               std::to_string(resume.choices.size()) +
                               " choices; the request has " + std::to_string(num_choices),
                           kStreamResumeField);
  }
  if (std::ranges::all_of(resume.choices, &ResumedChoice::finished)) {
    return invalid_request(
        std::string(kStreamResumeField) + ": every choice has finished; nothing is left",
        kStreamResumeField);
  }
  return resume;
}

}  // namespace

void log_ignored_fields(const std::vector<std::string>& fields) {
  if (fields.empty()) return;
  std::string names;
  for (const std::string& field : fields) names += (names.empty() ? "" : ", ") + field;
  PDS_LOG_INFO("ignored request fields (--strict-request-fields refuses them): " + names);
}

ApiResult<PreparedGeneration> prepare_generation(const http::HttpRequest& request, bool chat,
                                                 const GenerationContext& context) {
  ApiResult<nlohmann::ordered_json> body = parse_json_body(request.body);
  if (!body.ok()) return body.error();
  const bool from_cluster = cluster_token_matches(request, context.cluster_token);
  // The proxy's resumption of a stream is no OpenAI field.
  std::optional<nlohmann::json> resume_field;
  if (const auto field = body.value().find(kStreamResumeField); field != body.value().end()) {
    if (!from_cluster) {
      return unauthorized(std::string(kStreamResumeField) + " needs the cluster token");
    }
    resume_field = nlohmann::json::parse(field->dump());
    body.value().erase(field);
  }
  PreparedGeneration prepared;
  if (const auto field = body.value().find("pdserve_test_output");
      context.test_scripted_output && field != body.value().end()) {
    if (!field->is_string()) {
      return invalid_request("pdserve_test_output must be a string", "pdserve_test_output");
    }
    Result<std::vector<int32_t>> ids = context.tokenizer.encode(field->get<std::string>());
    if (!ids.ok()) return invalid_request(ids.status().message(), "pdserve_test_output");
    prepared.scripted_output = std::move(ids).value();
    body.value().erase(field);
  }
  const ModelInfo& model = context.model;
  ApiResult<GenerationRequest> parsed =
      chat
          ? parse_chat_completion_request(body.value(), model.vocab_size,
                                          context.strict_request_fields)
          : parse_completion_request(body.value(), model.vocab_size, context.strict_request_fields);
  if (!parsed.ok()) return parsed.error();
  prepared.request = std::move(parsed).value();
  const GenerationRequest& req = prepared.request;
  log_ignored_fields(req.ignored_fields);
  if (!req.model.empty() && req.model != model.name) return model_not_found(req.model);
  ApiResult<std::vector<PreparedPrompt>> prompts = prepare_prompts(req, chat, context);
  if (!prompts.ok()) return prompts.error();
  prepared.prompts = std::move(prompts).value();
  if (resume_field) {
    ApiResult<StreamResume> resume = parse_resume(*resume_field, req, prepared.num_choices());
    if (!resume.ok()) return resume.error();
    prepared.resume = std::move(resume).value();
  }
  prepared.resumable = req.stream && request.header(kResumableHeader) == "1" && from_cluster;
  // vLLM echoes the last message when it has the answer's role: assistant, or any role when no
  // generation prompt opens a new turn.
  if (chat && req.echo &&
      (!req.add_generation_prompt || req.messages.back()["role"] == "assistant")) {
    prepared.chat_echo = req.messages.back()["content"].get<std::string>();
  }
  return prepared;
}

}  // namespace pdserve
