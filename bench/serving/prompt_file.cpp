#include "bench/serving/prompt_file.h"

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/core/files.h"

namespace pdserve::bench {
namespace {

using Json = nlohmann::json;

// Fills `request` from one parsed line; returns what is wrong with it, empty when nothing.
std::string read_entry(const Json& entry, int default_output_len, BenchRequest& request) {
  if (!entry.is_object()) return "expected a JSON object";
  const auto prompt = entry.find("prompt");
  if (prompt == entry.end()) return "missing \"prompt\"";
  if (prompt->is_string()) {
    request.prompt_text = prompt->get<std::string>();
    if (request.prompt_text.empty()) return "\"prompt\" is an empty string";
  } else if (prompt->is_array()) {
    if (prompt->empty()) return "\"prompt\" is an empty array";
    request.prompt.reserve(prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
      const Json& id = (*prompt)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return "\"prompt\"[" + std::to_string(i) + "] is not a token id (" + id.dump() + ")";
      }
      request.prompt.push_back(id.get<int32_t>());
    }
  } else {
    return "\"prompt\" must be a string or an array of token ids";
  }
  request.output_len = default_output_len;
  if (const auto output_len = entry.find("output_len"); output_len != entry.end()) {
    if (!output_len->is_number_integer() || output_len->get<int64_t>() < 1 ||
        output_len->get<int64_t>() > (1 << 24)) {
      return "\"output_len\" must be an integer in [1, 16777216], got " + output_len->dump();
    }
    request.output_len = output_len->get<int>();
  }
  return {};
}

}  // namespace

Result<std::vector<BenchRequest>> parse_prompt_lines(std::string_view text,
                                                     const std::string& source,
                                                     int default_output_len) {
  std::vector<BenchRequest> requests;
  size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = source + ":" + std::to_string(line_number) + ": ";
    const Json entry = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (entry.is_discarded()) return invalid_argument(where + "not a JSON value (JSONL expected)");
    BenchRequest request;
    if (std::string problem = read_entry(entry, default_output_len, request); !problem.empty()) {
      return invalid_argument(where + problem);
    }
    requests.push_back(std::move(request));
  }
  if (requests.empty()) return invalid_argument(source + ": no prompts (empty JSONL file)");
  return requests;
}

Result<std::vector<BenchRequest>> read_prompt_file(const std::filesystem::path& path,
                                                   int default_output_len) {
  PDS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_prompt_lines(text, path.string(), default_output_len);
}

}  // namespace pdserve::bench
