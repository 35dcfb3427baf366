#include "common/core/json_depth.h"

#include <string>

namespace pdserve {

Status check_json_depth(std::string_view text, std::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return invalid_argument(std::string(what) + " nests deeper than " +
                                std::to_string(kMaxJsonDepth) + " levels (at byte " +
                                std::to_string(i) + ")");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::ok_status();
}

Result<nlohmann::json> parse_json_bounded(std::string_view text, std::string_view what) {
  PDS_RETURN_IF_ERROR(check_json_depth(text, what));
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalid_argument(std::string(what) + " is not valid JSON");
  return value;
}

}  // namespace pdserve
