// Server-sent events as the translated APIs (Responses, Anthropic Messages) read and write them:
// a reader that frames the chat stream's bytes into the data of each event, and the writer of
// a named event ("event: NAME\ndata: JSON\n\n"), the shape both APIs' SDKs parse.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve::api {

// The most bytes held for one event: the client connection's stream queue (8 MiB) could not
// take a larger one anyway.
inline constexpr size_t kMaxSseEventBytes = size_t{8} << 20;

// Frames an SSE byte stream, split across writes in any way ("\n\n" or "\r\n\r\n" ends an
// event), into the data of its events; comments (": ...") and events without data are
// dropped. Multi-line data is joined with "\n" (the SSE rule).
class SseDataReader {
 public:
  // The data of every event that `bytes` completes, in order.
  std::vector<std::string> feed(std::string_view bytes);
  // An event grew past kMaxSseEventBytes without ending: its bytes were dropped.
  bool overflowed() const { return overflowed_; }

 private:
  std::string pending_;
  bool overflowed_ = false;
};

// "event: NAME\ndata: <compact json>\n\n" (invalid UTF-8 replaced, never throws).
std::string named_sse_event(std::string_view name, const nlohmann::ordered_json& payload);

}  // namespace pdserve::api
