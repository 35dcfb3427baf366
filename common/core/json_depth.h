// The nesting limit on every JSON text pdserve parses from a client or a peer (request bodies,
// cluster calls, answers and events from other nodes). nlohmann's parser and destructor are
// iterative, but copying, dumping and comparing a value recurse: 500k levels of '[' would
// overflow the stack. The text is scanned before it is parsed.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

inline constexpr int kMaxJsonDepth = 64;

// InvalidArgument "<what> nests deeper than 64 levels (at byte N)" when the arrays and objects
// of `text` nest deeper than kMaxJsonDepth (brackets inside strings do not count); OK
// otherwise. Does not check that `text` is valid JSON.
Status check_json_depth(std::string_view text, std::string_view what);

// check_json_depth, then the parse: InvalidArgument "<what> is not valid JSON" for malformed
// text.
Result<nlohmann::json> parse_json_bounded(std::string_view text, std::string_view what);

}  // namespace pdserve
