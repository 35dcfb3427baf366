// Chat templates (the Jinja `chat_template` of a Hugging Face tokenizer_config.json) rendered
// byte-for-byte like transformers' apply_chat_template on every conversation we test (Qwen3,
// Qwen2.5, QwQ templates; tests/chat/hf_chat_template_oracle_test.py checks it live). The
// interpreter follows @huggingface/jinja, the engine transformers.js uses, except where Python
// Jinja2 differs in what chat templates rely on: str.strip/lstrip/rstrip(chars) and tojson's
// float format. The template is interpreted, not hard-coded.
//
// Key order matters: tool schemas go through `tojson`, which keeps insertion order. Pass an
// nlohmann::ordered_json context to keep the order the client sent; nlohmann::json stores keys
// sorted, so that order is what a plain json context renders with.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Syntax errors -> InvalidArgument naming the template line:column.
  static Result<ChatTemplate> parse(std::string_view source);
  // Reads "chat_template" (a string, or the list-of-{name, template} form: picks "default")
  // plus bos_token/eos_token (strings, null, or {"content": ...} objects).
  static Result<ChatTemplate> from_tokenizer_config(const std::filesystem::path& path);
  // A template file (vLLM's --chat-template) with the bos/eos tokens of a tokenizer config.
  static Result<ChatTemplate> from_file(const std::filesystem::path& template_path,
                                        const std::filesystem::path& tokenizer_config);

  // `context` must be a JSON object; its keys become template variables (messages, tools,
  // add_generation_prompt, enable_thinking, ...); bos_token/eos_token are added when absent.
  // Runtime errors (raise_exception, type errors, runaway loops or recursion, oversized output)
  // come back as a Status naming the template position; nothing crashes or hangs.
  // Thread-safe: a ChatTemplate is immutable and renders may run concurrently.
  Result<std::string> render(const nlohmann::json& context) const;
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  const std::string& source() const;

 private:
  ChatTemplate(std::shared_ptr<const jinja::Program> program,
               nlohmann::ordered_json special_tokens);

  std::shared_ptr<const jinja::Program> program_;
  nlohmann::ordered_json special_tokens_;  // {"bos_token": ..., "eos_token": ...} when known
};

}  // namespace pdserve
