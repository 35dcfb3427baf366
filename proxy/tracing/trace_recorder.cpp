#include "proxy/tracing/trace_recorder.h"

#include <charconv>

#include "common/core/log.h"
#include "common/http/api_error_response.h"

namespace pdserve::proxy {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding ('+' is a space); nullopt for a broken escape.
std::optional<std::string> url_decode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] != '%') {
      out += text[i];
    } else if (i + 2 < text.size() && hex_value(text[i + 1]) >= 0 && hex_value(text[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2]));
      i += 2;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

ApiResult<TraceQuery> parse_trace_query(std::string_view target, size_t capacity) {
  TraceQuery query;
  bool has_last = false;
  const size_t question = target.find('?');
  std::string_view rest =
      question == std::string_view::npos ? std::string_view() : target.substr(question + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t equals = pair.find('=');
    const std::string_view key = pair.substr(0, equals);
    const std::optional<std::string> value =
        url_decode(equals == std::string_view::npos ? std::string_view() : pair.substr(equals + 1));
    if (!value)
      return invalid_request("bad percent-escape in " + std::string(key), std::string(key));
    if (key == "last") {
      size_t last = 0;
      const auto [end, error] = std::from_chars(value->data(), value->data() + value->size(), last);
      if (error != std::errc() || end != value->data() + value->size() || last < 1 ||
          last > capacity) {
        return invalid_request("last must be an integer from 1 to " + std::to_string(capacity) +
                                   " (the trace capacity), got '" + *value + "'",
                               "last");
      }
      query.last = last;
      has_last = true;
    } else if (key == "request_id") {
      if (value->empty()) return invalid_request("request_id is empty", "request_id");
      query.request_id = *value;
    } else {
      return invalid_request(
          "unknown parameter '" + std::string(key) + "' (GET /trace takes last=N or request_id=ID)",
          std::string(key));
    }
  }
  if (has_last && !query.request_id.empty()) {
    return invalid_request("give last or request_id, not both", "request_id");
  }
  return query;
}

Status TraceRecorder::write_to_file(const std::string& path) {
  PDS_ASSIGN_OR_RETURN(file_, TraceFile::open(path));
  return {};
}

void TraceRecorder::record(const RecordedTimeline& request) {
  store_.add(request);
  if (!file_) return;
  if (Status written = file_->append(request); !written.ok()) PDS_LOG_WARN(written.message());
}

http::HttpResponse TraceRecorder::handle(const http::HttpRequest& request) const {
  ApiResult<TraceQuery> query = parse_trace_query(request.target, store_.capacity());
  if (!query.ok()) return http::api_error_response(query.error());
  std::vector<RecordedTimeline> requests;
  if (query->request_id.empty()) {
    requests = store_.last(query->last);
  } else if (std::optional<RecordedTimeline> found = store_.find(query->request_id)) {
    requests.push_back(std::move(*found));
  } else {
    ApiError error = api_error_from_status(
        not_found("no timeline for request '" + query->request_id + "' among the last " +
                  std::to_string(store_.capacity()) + " requests"));
    error.param = "request_id";
    return http::api_error_response(error);
  }
  return {200, "application/json", {}, chrome_trace_document(requests).dump()};
}

}  // namespace pdserve::proxy
