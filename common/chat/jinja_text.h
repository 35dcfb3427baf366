// UTF-8 text helpers that reproduce JavaScript string semantics, because the reference engine
// for chat templates (@huggingface/jinja) is JavaScript: its notion of whitespace (\s, trim),
// of string length (UTF-16 code units) and of number formatting (Number#toString) decides the
// bytes a template renders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::jinja {

// Decodes the code point at `pos` (advancing `pos`); malformed bytes decode as U+FFFD, one byte.
char32_t decode_utf8(std::string_view text, size_t& pos);
void append_utf8(std::string& out, char32_t code_point);
std::vector<char32_t> to_code_points(std::string_view text);

// JavaScript's \s / String#trim set (ASCII whitespace, NBSP, BOM, Unicode Zs, LS, PS).
bool is_js_space(char32_t code_point);
// Byte length of the JS whitespace code point starting at `pos`, or 0.
size_t js_space_at(std::string_view text, size_t pos);
// Byte length of the JS whitespace code point ending just before `end`, or 0.
size_t js_space_before(std::string_view text, size_t end);
std::string_view js_trim_start(std::string_view text);
std::string_view js_trim_end(std::string_view text);
std::string_view js_trim(std::string_view text);

// Length in UTF-16 code units (what String#length reports).
size_t utf16_length(std::string_view text);
// The UTF-16 unit at `index` (negative counts from the end) as UTF-8; a lone surrogate half
// becomes U+FFFD. Returns false when out of range.
bool utf16_unit_at(std::string_view text, int64_t index, std::string& out);

// Full-string case mapping (per code point, Unicode simple case mapping).
std::string to_upper(std::string_view text);
std::string to_lower(std::string_view text);
// /\b\w/g -> upper case: only ASCII letters that start an ASCII word change.
std::string title_case_ascii_words(std::string_view text);
// Upper-cases the first code point only (String#charAt(0).toUpperCase() + rest).
std::string capitalize_first(std::string_view text);

// ECMAScript Number::toString(x) ("1e-7", "0.30000000000000004", "1e+21", "NaN", "-Infinity").
std::string js_number_to_string(double value);
// Python's repr(float), which json.dumps (and so transformers' tojson) writes: shortest
// round-trip digits, fixed notation with a ".0" for decimal exponents -4..15, else
// "1.5e-07" / "1e+16" (two exponent digits at least). Finite values only.
std::string python_float_repr(double value);

enum class StripSide { kBoth, kStart, kEnd };
// Python's str.strip/lstrip/rstrip: without `chars` (nullptr) removes the code points for which
// str.isspace() holds; with it, any code point in `chars`.
std::string python_strip(std::string_view text, const std::string* chars, StripSide side);
// ECMAScript StringToNumber (used by loose equality): trims, accepts decimal, 0x/0o/0b,
// Infinity; "" is 0; anything else is NaN.
double js_string_to_number(std::string_view text);
// parseInt(text, 10) / parseFloat(text): false when no digits could be read (NaN).
bool js_parse_int(std::string_view text, double& value);
bool js_parse_float(std::string_view text, double& value);

}  // namespace pdserve::jinja
