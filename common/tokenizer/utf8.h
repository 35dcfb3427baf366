// UTF-8 helpers shared by the encoder (strict validation) and the decoders (lossy conversion
// with the same U+FFFD policy as Rust's String::from_utf8_lossy and the WHATWG decoder: each
// maximal invalid subpart becomes one replacement character).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve::tokenizer_detail {

// Byte offset of the first byte that is not part of well-formed UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or nullopt if `text` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Appends `bytes` to `out` as valid UTF-8, replacing each maximal invalid subpart with U+FFFD.
// With `keep_incomplete_tail`, a trailing sequence that is a valid but unfinished prefix is not
// converted; the return value is the number of bytes consumed (bytes.size() otherwise).
size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool keep_incomplete_tail);

}  // namespace pdserve::tokenizer_detail
