#include "common/chat/jinja_error.h"

namespace pdserve::jinja {

std::string describe_position(std::string_view source, size_t offset) {
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ":" + std::to_string(offset - line_start + 1);
}

void throw_at(std::string_view source, size_t offset, StatusCode code, std::string_view message) {
  throw LocatedError(
      Status(code, "template " + describe_position(source, offset) + ": " + std::string(message)));
}

void fail(std::string message) {
  PDS_THROW(StatusCode::kInvalidArgument, std::move(message));
}

void fail_resource(std::string message) {
  PDS_THROW(StatusCode::kResourceExhausted, std::move(message));
}

}  // namespace pdserve::jinja
