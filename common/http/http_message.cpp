#include "common/http/http_message.h"

#include <strings.h>
#include <cstdio>

namespace pdserve::http {
namespace {

void append_headers(std::string& out, const HeaderList& headers) {
  for (const auto& [name, value] : headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
}

void append_status_line(std::string& out, int status) {
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out += reason_phrase(status);
  out += "\r\n";
}

}  // namespace

std::optional<std::string_view> find_header(const HeaderList& headers, std::string_view name) {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() && strncasecmp(key.data(), name.data(), key.size()) == 0) {
      return value;
    }
  }
  return std::nullopt;
}

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  return find_header(headers, name);
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

std::string serialize_response(const HttpResponse& response, bool keep_alive) {
  std::string out;
  out.reserve(response.body.size() + 256);
  append_status_line(out, response.status);
  out += "Content-Type: " + response.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  append_headers(out, response.headers);
  out += "\r\n";
  out += response.body;
  return out;
}

std::string serialize_stream_head(int status, std::string_view content_type,
                                  const HeaderList& headers, bool keep_alive,
                                  StreamFraming framing) {
  const bool chunked = framing == StreamFraming::kChunked;
  std::string out;
  append_status_line(out, status);
  out += "Content-Type: ";
  out += content_type;
  out += "\r\n";
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  out += "Cache-Control: no-cache\r\n";
  out += chunked && keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  append_headers(out, headers);
  out += "\r\n";
  return out;
}

std::string serialize_chunk(std::string_view data) {
  char size[24];
  const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out(size, static_cast<size_t>(n));
  out += data;
  out += "\r\n";
  return out;
}

std::string_view last_chunk() {
  return "0\r\n\r\n";
}

}  // namespace pdserve::http
