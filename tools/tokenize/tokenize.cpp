// pdserve-tokenize: a line-oriented tokenizer for scripts and tests. Each line of stdin is one
// JSON value and produces one JSON value on stdout:
//   (default)       "text"                          -> [ids]
//   --decode        [ids]                           -> "text"
//   --chat          {"messages": [...], "tools": [...], "add_generation_prompt": bool,
//                    "enable_thinking": bool}       -> [ids of the rendered prompt]
//   --chat --render the same object                 -> "rendered prompt text"
//   --chat-template FILE renders with that Jinja file instead of the model's template.
// The first bad line stops the run with "error: line N: ..." on stderr and exit code 2.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/core/cli.h"
#include "common/model/model_path.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {
namespace {

struct Options {
  std::string model;
  bool decode = false;
  bool chat = false;
  bool render = false;
  std::string chat_template;  // a Jinja file; empty: the model's tokenizer_config.json template
};

Result<nlohmann::ordered_json> process_line(const Options& options, const Tokenizer& tokenizer,
                                            const std::optional<ChatTemplate>& chat_template,
                                            const std::string& line) {
  nlohmann::ordered_json input = nlohmann::ordered_json::parse(line, nullptr, false);
  if (input.is_discarded()) return invalid_argument("not valid JSON");
  if (options.decode) {
    if (!input.is_array()) return invalid_argument("--decode expects an array of token ids");
    std::vector<int32_t> ids;
    for (const auto& id : input) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return invalid_argument("token ids must be non-negative integers");
      }
      ids.push_back(id.get<int32_t>());
    }
    PDS_ASSIGN_OR_RETURN(std::string text, tokenizer.decode(ids));
    return nlohmann::ordered_json(text);
  }
  std::string text;
  if (options.chat) {
    if (!input.is_object() || !input.contains("messages") || !input["messages"].is_array()) {
      return invalid_argument("--chat expects an object with a \"messages\" array");
    }
    PDS_ASSIGN_OR_RETURN(text, chat_template->render(input));
    if (options.render) return nlohmann::ordered_json(text);
  } else {
    if (!input.is_string()) return invalid_argument("expected a JSON string");
    text = input.get<std::string>();
  }
  PDS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.encode(text));
  return nlohmann::ordered_json(ids);
}

Status run(const Options& options) {
  if (options.decode && options.chat) return invalid_argument("--decode and --chat exclude each other");
  if (options.render && !options.chat) return invalid_argument("--render needs --chat");
  if (!options.chat_template.empty() && !options.chat) {
    return invalid_argument("--chat-template needs --chat");
  }
  PDS_ASSIGN_OR_RETURN(std::filesystem::path dir, resolve_model_path(options.model));
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(dir));
  std::optional<ChatTemplate> chat_template;
  if (options.chat) {
    if (options.chat_template.empty()) {
      PDS_ASSIGN_OR_RETURN(chat_template, ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json"));
    } else {
      PDS_ASSIGN_OR_RETURN(chat_template, ChatTemplate::from_file(options.chat_template,
                                                                  dir / "tokenizer_config.json"));
    }
  }
  std::string line;
  for (size_t number = 1; std::getline(std::cin, line); ++number) {
    if (line.empty()) continue;
    Result<nlohmann::ordered_json> output = process_line(options, tokenizer, chat_template, line);
    if (!output.ok()) return output.status().with_context("line " + std::to_string(number));
    std::fputs(output->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str(), stdout);
    std::fputc('\n', stdout);
  }
  return {};
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-tokenize: one JSON value per stdin line -> one JSON value per stdout line"};
  app.add_option("--model", options.model, "Model folder, or a hub id in the local HF cache")->required();
  app.add_flag("--decode", options.decode, "Input lines are id arrays; output their text");
  app.add_flag("--chat", options.chat,
               "Input lines are {messages, tools, add_generation_prompt, enable_thinking}; output the "
               "ids of the rendered chat prompt");
  app.add_flag("--render", options.render, "With --chat: output the rendered prompt text instead of ids");
  app.add_option("--chat-template", options.chat_template,
                 "With --chat: a Jinja template file to use instead of the model's");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
