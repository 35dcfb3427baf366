// Client fields stay client fields (issue #34 item 2): the proxy sends client requests to the
// nodes with its own cluster token, so a field that nodes honour from token holders alone
// (common/protocol/cluster_only_fields.h) must not ride along from a client.
#pragma once

#include <optional>
#include <string_view>

#include "common/protocol/openai_error.h"

namespace pdserve::proxy {

// The 400 to answer when the JSON object `body` has a top-level field of
// kClusterOnlyBodyFields (keys compared as JSON decodes them, so "pdserve\u005fresume" counts),
// naming the field; nullopt otherwise. Every client is refused, token holders too: through the
// proxy, only the proxy resumes streams. A body that is not valid JSON gets nullopt: the decode
// node parses it with the same parser and answers the 400.
std::optional<ApiError> cluster_only_field_refusal(std::string_view body);

}  // namespace pdserve::proxy
