// What the proxy hides from clients that do not hold the cluster token: node addresses and ids
// in error messages and in the per-request timeline (issue #15: internal topology never
// reaches a client), and the token itself in error messages (issue #34). Operators get the
// same text unredacted in the proxy's log and, with the token, in responses.
#pragma once

#include <string>
#include <string_view>

#include "common/protocol/request_timeline.h"

namespace pdserve::proxy {

inline constexpr std::string_view kRedactedAddress = "<internal>";

// `text` with every URL (scheme://...) and IPv4 address (a.b.c.d[:port]) replaced by
// kRedactedAddress.
std::string redact_addresses(std::string_view text);

// A timeline (docs/TRACING.md) for a client without the token: each span's node is its role
// alone ("decode", "prefill", "proxy"), node ids and URLs leave the span args, and every other
// string has its addresses redacted.
RequestTimeline redact_timeline(const RequestTimeline& timeline);

inline constexpr std::string_view kRedactedSecret = "<redacted>";

// `text` with every occurrence of `secret` replaced by kRedactedSecret; unchanged for an empty
// secret (an open cluster).
std::string redact_secret(std::string_view text, std::string_view secret);

// An OpenAI error body (or an SSE error event's data) with the addresses in its message
// redacted and `secret` (the cluster token) redacted from every string in it; a body that is
// not such an object gets both redactions as text.
std::string redact_error_body(std::string_view body, std::string_view secret);

}  // namespace pdserve::proxy
