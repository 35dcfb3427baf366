// The request and response values that HTTP handlers see: plain structs, so that handler code
// needs no Boost.Beast headers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pdserve::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The first header with this name (case-insensitive).
std::optional<std::string_view> find_header(const HeaderList& headers, std::string_view name);

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // target without the query string
  HeaderList headers;
  std::string body;

  // The first header with this name (case-insensitive).
  std::optional<std::string_view> header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HeaderList headers;  // extra headers, e.g. Retry-After or Allow
  std::string body;
};

// The HTTP/1.1 status line, headers and body of a response with Content-Length.
std::string serialize_response(const HttpResponse& response, bool keep_alive);
// How a streamed body is delimited: chunked (HTTP/1.1), or, for an HTTP/1.0 client, which
// knows no transfer coding, by the server closing the connection.
enum class StreamFraming { kChunked, kUntilClose };

// The status line and headers of a streamed response. kUntilClose sends no Transfer-Encoding
// and always "Connection: close" (keep_alive is then ignored).
std::string serialize_stream_head(int status, std::string_view content_type,
                                  const HeaderList& headers, bool keep_alive,
                                  StreamFraming framing);
// One chunk of a chunked body ("" is never sent as a chunk: it would end the body).
std::string serialize_chunk(std::string_view data);
// The last chunk, which ends a chunked body.
std::string_view last_chunk();

// "OK", "Not Found", ... for any status code.
std::string_view reason_phrase(int status);

}  // namespace pdserve::http
