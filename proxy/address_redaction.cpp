#include "proxy/address_redaction.h"

#include <cctype>

#include "common/core/json_depth.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

bool is_scheme_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '+' || c == '-' || c == '.';
}

// Where a URL's authority and path end: at whitespace, a quote, a comma, a semicolon or a
// parenthesis (not a bracket: an IPv6 host has them).
bool ends_url(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0 || c == '"' || c == '\'' || c == ',' ||
         c == ')' || c == '(' || c == '>' || c == ';';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The length of an IPv4 address with an optional port at text[at], or 0.
size_t ipv4_length(std::string_view text, size_t at) {
  size_t i = at;
  for (int part = 0; part < 4; ++part) {
    const size_t digits_start = i;
    while (i < text.size() && is_digit(text[i]) && i - digits_start < 3) ++i;
    if (i == digits_start) return 0;
    if (part < 3) {
      if (i >= text.size() || text[i] != '.') return 0;
      ++i;
    }
  }
  if (i < text.size() && is_digit(text[i])) return 0;  // a fourth part of four digits
  if (i + 1 < text.size() && text[i] == '.' && is_digit(text[i + 1])) return 0;  // a.b.c.d.e
  if (i + 1 < text.size() && text[i] == ':' && is_digit(text[i + 1])) {
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
  }
  return i - at;
}

}  // namespace

std::string redact_addresses(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "://") == 0) {
      // Take back the scheme already copied, then skip to the end of the URL.
      size_t scheme = 0;
      while (scheme < out.size() && is_scheme_char(out[out.size() - 1 - scheme])) ++scheme;
      out.resize(out.size() - scheme);
      out += kRedactedAddress;
      i += 3;
      size_t end = i;
      while (end < text.size() && !ends_url(text[end])) ++end;
      // Punctuation after a URL belongs to the sentence ("http://h:1: refused").
      while (end > i && (text[end - 1] == ':' || text[end - 1] == '.')) --end;
      i = end;
      continue;
    }
    const bool word_start = i == 0 || !(is_digit(text[i - 1]) || text[i - 1] == '.');
    if (word_start && is_digit(text[i])) {
      if (const size_t length = ipv4_length(text, i); length > 0) {
        out += kRedactedAddress;
        i += length;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

RequestTimeline redact_timeline(const RequestTimeline& timeline) {
  RequestTimeline redacted = timeline;
  redacted.request_id = redact_addresses(redacted.request_id);
  redacted.trace_id = redact_addresses(redacted.trace_id);
  for (RequestTimelineSpan& span : redacted.spans) {
    span.name = redact_addresses(span.name);
    span.node = redact_addresses(span.node.substr(0, span.node.find(' ')));
    for (const char* key : {"decode", "prefill", "prefill_url"}) span.args.erase(key);
    for (auto& [key, value] : span.args) {
      if (auto* text = std::get_if<std::string>(&value)) *text = redact_addresses(*text);
    }
  }
  return redacted;
}

std::string redact_secret(std::string_view text, std::string_view secret) {
  if (secret.empty()) return std::string(text);
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(secret); at != std::string_view::npos; at = text.find(secret, from)) {
    out.append(text.substr(from, at - from));
    out += kRedactedSecret;
    from = at + secret.size();
  }
  out.append(text.substr(from));
  return out;
}

namespace {

// Every string value in `value`, which nests at most kMaxJsonDepth deep (it was parsed bounded).
void redact_secret_in_strings(Json& value, std::string_view secret) {
  if (value.is_string()) {
    value = redact_secret(value.get_ref<const std::string&>(), secret);
  } else if (value.is_structured()) {
    for (Json& item : value) redact_secret_in_strings(item, secret);
  }
}

}  // namespace

std::string redact_error_body(std::string_view body, std::string_view secret) {
  const auto as_text = [&] { return redact_secret(redact_addresses(body), secret); };
  Result<Json> parsed = parse_json_bounded(body, "an error body");
  if (!parsed.ok() || !parsed->is_object()) return as_text();
  auto error = parsed->find("error");
  if (error == parsed->end() || !error->is_object()) return as_text();
  if (auto message = error->find("message"); message != error->end() && message->is_string()) {
    *message = redact_addresses(message->get_ref<const std::string&>());
  }
  redact_secret_in_strings(*parsed, secret);
  return parsed->dump();
}

}  // namespace pdserve::proxy
