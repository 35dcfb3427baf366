#include "common/chat/chat_template.h"

#include <utility>

#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_json_input.h"
#include "common/chat/jinja_parser.h"
#include "common/core/files.h"

namespace pdserve {

ChatTemplate::ChatTemplate(std::shared_ptr<const jinja::Program> program,
                           nlohmann::ordered_json special_tokens)
    : program_(std::move(program)), special_tokens_(std::move(special_tokens)) {}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  PDS_ASSIGN_OR_RETURN(jinja::Program program, jinja::parse_template(source));
  return ChatTemplate(std::make_shared<const jinja::Program>(std::move(program)),
                      nlohmann::ordered_json::object());
}

namespace {

Result<std::string> select_template(const nlohmann::json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array())
    return invalid_argument(where + ": chat_template must be a string or a list");
  std::string names;
  for (const auto& entry : value) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
      return invalid_argument(where + ": chat_template list entries need a string \"name\"");
    }
    std::string name = entry["name"].get<std::string>();
    if (name == "default") {
      if (!entry.contains("template") || !entry["template"].is_string()) {
        return invalid_argument(where + ": chat_template \"default\" has no string \"template\"");
      }
      return entry["template"].get<std::string>();
    }
    names += (names.empty() ? "" : ", ") + name;
  }
  return not_found(where + ": chat_template list has no \"default\" entry (has: " + names + ")");
}

}  // namespace

namespace {

// bos_token/eos_token of a tokenizer config (strings, null, or {"content": ...} objects).
Result<nlohmann::ordered_json> read_special_tokens(const nlohmann::json& config,
                                                   const std::string& where) {
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token"}) {
    if (!config.contains(key)) continue;
    const nlohmann::json& token = config[key];
    if (token.is_string() || token.is_null()) {
      special_tokens[key] = token;
    } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      special_tokens[key] = token["content"];
    } else {
      return invalid_argument(where + ": \"" + key +
                              "\" must be a string, null or {\"content\": ...}");
    }
  }
  return special_tokens;
}

Result<nlohmann::json> read_tokenizer_config(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json config, read_json_file(path));
  if (!config.is_object())
    return invalid_argument(path.string() + ": tokenizer config is not a JSON object");
  return config;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json config, read_tokenizer_config(path));
  const std::string where = path.string();
  if (!config.contains("chat_template")) return not_found(where + ": no \"chat_template\"");
  PDS_ASSIGN_OR_RETURN(std::string source, select_template(config["chat_template"], where));
  PDS_ASSIGN_OR_RETURN(nlohmann::ordered_json special_tokens, read_special_tokens(config, where));
  auto parsed = parse(source);
  if (!parsed.ok()) return parsed.status().with_context("chat_template of " + where);
  return ChatTemplate(std::move(parsed.value().program_), std::move(special_tokens));
}

Result<ChatTemplate> ChatTemplate::from_file(const std::filesystem::path& template_path,
                                             const std::filesystem::path& tokenizer_config) {
  PDS_ASSIGN_OR_RETURN(std::string source, read_text_file(template_path));
  PDS_ASSIGN_OR_RETURN(nlohmann::json config, read_tokenizer_config(tokenizer_config));
  PDS_ASSIGN_OR_RETURN(nlohmann::ordered_json special_tokens,
                       read_special_tokens(config, tokenizer_config.string()));
  auto parsed = parse(source);
  if (!parsed.ok()) return parsed.status().with_context(template_path.string());
  return ChatTemplate(std::move(parsed.value().program_), std::move(special_tokens));
}

const std::string& ChatTemplate::source() const {
  return program_->source;
}

namespace {

template <typename Json>
Result<std::string> render_program(const jinja::Program& program,
                                   const nlohmann::ordered_json& special_tokens,
                                   const Json& context) {
  if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
  return capture_status([&]() -> Result<std::string> {
    jinja::Scope globals;
    jinja::install_globals(globals);
    for (auto it = context.begin(); it != context.end(); ++it) {
      if (globals.has_local(it.key())) {
        return invalid_argument("context variable '" + it.key() +
                                "' collides with a template built-in");
      }
      globals.set(it.key(), jinja::value_from_json(it.value()));
    }
    for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) {
      if (!context.contains(it.key())) globals.set(it.key(), jinja::value_from_json(it.value()));
    }
    jinja::Interpreter interpreter(program, jinja::RenderLimits{});
    return interpreter.render(globals);
  });
}

}  // namespace

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render_program(*program_, special_tokens_, context);
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_program(*program_, special_tokens_, context);
}

}  // namespace pdserve
