#include "proxy/routing/prompt_tokenizer.h"

#include <string>
#include <utility>

#include "common/protocol/chat_prompt.h"
#include "common/protocol/openai_request.h"

namespace pdserve::proxy {

std::string_view stable_text_prefix(std::string_view text, size_t limit) {
  if (text.size() <= limit) return text;
  for (size_t end = limit; end > 0; --end) {
    const char next = text[end];
    if (text[end - 1] == '\n' && next != ' ' && next != '\t' && next != '\n' && next != '\r' &&
        next != '\f' && next != '\v') {
      return text.substr(0, end);
    }
  }
  return {};
}

Result<PromptTokenizer> PromptTokenizer::load(const std::filesystem::path& dir,
                                              size_t max_text_bytes) {
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(dir));
  PDS_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                       ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json"));
  return PromptTokenizer(std::move(tokenizer), std::move(chat_template), max_text_bytes);
}

std::optional<PromptTokens> PromptTokenizer::encode(std::string_view text) const {
  const std::string_view stable = stable_text_prefix(text, max_text_bytes_);
  if (stable.empty()) return std::nullopt;
  Result<std::vector<int32_t>> ids = tokenizer_.encode(stable);
  if (!ids.ok()) return std::nullopt;
  return PromptTokens{std::move(ids).value(), stable.size() == text.size()};
}

std::optional<PromptTokens> PromptTokenizer::tokens(PromptKind kind, std::string_view body) const {
  if (body.size() > 4 * max_text_bytes_) return std::nullopt;
  ApiResult<nlohmann::ordered_json> json = parse_json_body(body);
  if (!json.ok()) return std::nullopt;
  const int vocab_size = tokenizer_.vocab_size();
  ApiResult<GenerationRequest> request =
      kind == PromptKind::kChat ? parse_chat_completion_request(json.value(), vocab_size)
                                : parse_completion_request(json.value(), vocab_size);
  if (!request.ok()) return std::nullopt;
  if (kind == PromptKind::kChat) {
    ApiResult<std::string> text = render_chat_prompt(request.value(), chat_template_);
    if (!text.ok()) return std::nullopt;
    return encode(text.value());
  }
  if (request.value().prompts.empty()) return std::nullopt;
  const Prompt& first = request.value().prompts.front();
  if (first.is_token_ids) return PromptTokens{first.token_ids, true};
  return encode(first.text);
}

}  // namespace pdserve::proxy
