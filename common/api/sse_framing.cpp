#include "common/api/sse_framing.h"

#include <utility>

namespace pdserve::api {
namespace {

// The data of one event's text (without its blank line), or nullopt without a data field.
std::optional<std::string> event_data(std::string_view event) {
  std::optional<std::string> data;
  while (!event.empty()) {
    const size_t end = event.find('\n');
    std::string_view line = event.substr(0, end);
    event = end == std::string_view::npos ? std::string_view() : event.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.starts_with("data:")) continue;  // comments, event names, ids
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (data) {
      data->push_back('\n');
      data->append(line);
    } else {
      data.emplace(line);
    }
  }
  return data;
}

}  // namespace

std::vector<std::string> SseDataReader::feed(std::string_view bytes) {
  std::vector<std::string> out;
  if (overflowed_) return out;
  pending_.append(bytes);
  size_t start = 0;
  while (true) {
    const size_t lf = pending_.find("\n\n", start);
    const size_t crlf = pending_.find("\r\n\r\n", start);
    if (lf == std::string::npos && crlf == std::string::npos) break;
    const bool is_lf = crlf == std::string::npos || (lf != std::string::npos && lf < crlf);
    const size_t end = is_lf ? lf : crlf;
    if (std::optional<std::string> data =
            event_data(std::string_view(pending_).substr(start, end - start))) {
      out.push_back(std::move(*data));
    }
    start = end + (is_lf ? 2 : 4);
  }
  pending_.erase(0, start);
  if (pending_.size() > kMaxSseEventBytes) {
    overflowed_ = true;
    pending_.clear();
  }
  return out;
}

std::string named_sse_event(std::string_view name, const nlohmann::ordered_json& payload) {
  return "event: " + std::string(name) + "\ndata: " +
         payload.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n\n";
}

}  // namespace pdserve::api
