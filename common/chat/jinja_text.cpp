#include "common/chat/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include <utf8proc.h>

namespace pdserve::jinja {

char32_t decode_utf8(std::string_view text, size_t& pos) {
  constexpr char32_t kReplacement = 0xFFFD;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(pos);
  if (lead < 0x80) {
    ++pos;
    return lead;
  }
  size_t extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  if (extra == 0 || lead > 0xF4 || pos + extra >= text.size()) {
    ++pos;
    return kReplacement;
  }
  char32_t code_point = lead & (0x3F >> extra);
  for (size_t i = 1; i <= extra; ++i) {
    unsigned char next = byte(pos + i);
    if ((next & 0xC0) != 0x80) {
      ++pos;
      return kReplacement;
    }
    code_point = (code_point << 6) | (next & 0x3F);
  }
  static constexpr char32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
  if (code_point < kMinForLength[extra] || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    ++pos;
    return kReplacement;
  }
  pos += extra + 1;
  return code_point;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<char32_t> to_code_points(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(decode_utf8(text, pos));
  return out;
}

bool is_js_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}

size_t js_space_at(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  size_t next = pos;
  return is_js_space(decode_utf8(text, next)) ? next - pos : 0;
}

size_t js_space_before(std::string_view text, size_t end) {
  // Whitespace code points are at most 3 bytes long.
  for (size_t length = 1; length <= 3 && length <= end; ++length) {
    if (js_space_at(text, end - length) == length) return length;
  }
  return 0;
}

std::string_view js_trim_start(std::string_view text) {
  size_t pos = 0;
  while (size_t n = js_space_at(text, pos)) pos += n;
  return text.substr(pos);
}

std::string_view js_trim_end(std::string_view text) {
  size_t end = text.size();
  while (size_t n = js_space_before(text, end)) end -= n;
  return text.substr(0, end);
}

std::string_view js_trim(std::string_view text) {
  return js_trim_end(js_trim_start(text));
}

size_t utf16_length(std::string_view text) {
  size_t units = 0;
  for (size_t pos = 0; pos < text.size();) units += decode_utf8(text, pos) >= 0x10000 ? 2 : 1;
  return units;
}

bool utf16_unit_at(std::string_view text, int64_t index, std::string& out) {
  int64_t length = static_cast<int64_t>(utf16_length(text));
  if (index < 0) index += length;
  if (index < 0 || index >= length) return false;
  int64_t unit = 0;
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = decode_utf8(text, pos);
    int64_t width = cp >= 0x10000 ? 2 : 1;
    if (index < unit + width) {
      out.clear();
      append_utf8(out, width == 2 ? 0xFFFD : cp);
      return true;
    }
    unit += width;
  }
  return false;
}

namespace {

template <typename Map>
std::string map_code_points(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) append_utf8(out, map(decode_utf8(text, pos)));
  return out;
}

char32_t upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
bool is_ascii_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

}  // namespace

std::string to_upper(std::string_view text) {
  return map_code_points(text, upper);
}
std::string to_lower(std::string_view text) {
  return map_code_points(text, lower);
}

std::string title_case_ascii_words(std::string_view text) {
  std::string out(text);
  for (size_t i = 0; i < out.size(); ++i) {
    bool starts_word = is_ascii_word(out[i]) && (i == 0 || !is_ascii_word(text[i - 1]));
    if (starts_word && out[i] >= 'a' && out[i] <= 'z')
      out[i] = static_cast<char>(out[i] - 'a' + 'A');
  }
  return out;
}

std::string capitalize_first(std::string_view text) {
  if (text.empty()) return {};
  size_t pos = 0;
  char32_t first = decode_utf8(text, pos);
  std::string out;
  // charAt(0) of an astral character is a lone surrogate, which has no upper case.
  append_utf8(out, first >= 0x10000 ? first : upper(first));
  out.append(text.substr(pos));
  return out;
}

namespace {

// The shortest decimal digits that round-trip |value| (finite, non-zero), without the point,
// and the exponent of the first: |value| = d.ddd * 10^exponent. What both JavaScript's and
// Python's float printing start from.
struct ShortestDigits {
  std::string digits;
  int exponent;
};

ShortestDigits shortest_digits(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(value),
                                    std::chars_format::scientific);
  const std::string_view sci(buffer, static_cast<size_t>(result.ptr - buffer));
  const size_t e_pos = sci.find('e');
  ShortestDigits out{"", std::atoi(std::string(sci.substr(e_pos + 1)).c_str())};
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') out.digits += c;
  }
  return out;
}

}  // namespace

std::string js_number_to_string(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  if (value == 0) return "0";
  std::string out = value < 0 ? "-" : "";
  const auto [digits, exponent] = shortest_digits(value);
  const int k = static_cast<int>(digits.size());
  int n = exponent + 1;  // value = 0.digits * 10^n
  if (k <= n && n <= 21) {
    out += digits + std::string(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0 ? "e+" : "e-") + std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string python_float_repr(double value) {
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  std::string out = value < 0 ? "-" : "";
  const auto [digits, exponent] = shortest_digits(value);
  const int k = static_cast<int>(digits.size());
  if (-4 <= exponent && exponent < 16) {
    int n = exponent + 1;  // digits before the point
    if (n <= 0) {
      out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
    } else if (n >= k) {
      out += digits + std::string(static_cast<size_t>(n - k), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (k > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof(exponent_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exponent_text;
}

namespace {

bool python_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

// Each code point with the byte offset where it starts.
std::vector<std::pair<char32_t, size_t>> code_points(std::string_view text) {
  std::vector<std::pair<char32_t, size_t>> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t start = pos;
    out.emplace_back(decode_utf8(text, pos), start);
  }
  return out;
}

}  // namespace

std::string python_strip(std::string_view text, const std::string* chars, StripSide side) {
  std::vector<char32_t> set;
  if (chars) {
    for (const auto& point : code_points(*chars)) set.push_back(point.first);
  }
  auto strips = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : python_isspace(c);
  };
  std::vector<std::pair<char32_t, size_t>> points = code_points(text);
  size_t begin = 0;
  size_t end = points.size();
  if (side != StripSide::kEnd) {
    while (begin < end && strips(points[begin].first)) ++begin;
  }
  if (side != StripSide::kStart) {
    while (end > begin && strips(points[end - 1].first)) --end;
  }
  size_t from = begin < points.size() ? points[begin].second : text.size();
  size_t to = end < points.size() ? points[end].second : text.size();
  return std::string(text.substr(from, to - from));
}

namespace {

// Reads the longest decimal literal prefix ([+-]digits[.digits][e[+-]digits] or Infinity);
// returns the number of bytes used (0 when none).
size_t read_decimal(std::string_view text, double& value) {
  size_t pos = 0;
  bool negative = false;
  if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) negative = text[pos++] == '-';
  if (text.substr(pos).starts_with("Infinity")) {
    value = negative ? -std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::infinity();
    return pos + 8;
  }
  size_t digits_start = pos;
  size_t digit_count = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos, ++digit_count;
  if (pos < text.size() && text[pos] == '.') {
    size_t frac = pos + 1;
    size_t frac_digits = 0;
    while (frac < text.size() && text[frac] >= '0' && text[frac] <= '9') ++frac, ++frac_digits;
    if (digit_count + frac_digits > 0) {
      pos = frac;
      digit_count += frac_digits;
    }
  }
  if (digit_count == 0) return 0;
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    size_t exp = pos + 1;
    if (exp < text.size() && (text[exp] == '+' || text[exp] == '-')) ++exp;
    size_t exp_digits = exp;
    while (exp < text.size() && text[exp] >= '0' && text[exp] <= '9') ++exp;
    if (exp > exp_digits) pos = exp;
  }
  std::string literal(text.substr(digits_start, pos - digits_start));
  value = std::strtod(literal.c_str(), nullptr);
  if (negative) value = -value;
  return pos;
}

}  // namespace

double js_string_to_number(std::string_view text) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  text = js_trim(text);
  if (text.empty()) return 0;
  if (text.size() > 2 && text[0] == '0') {
    int base = (text[1] == 'x' || text[1] == 'X')   ? 16
               : (text[1] == 'o' || text[1] == 'O') ? 8
               : (text[1] == 'b' || text[1] == 'B') ? 2
                                                    : 0;
    if (base != 0) {
      double value = 0;
      for (char c : text.substr(2)) {
        int digit = (c >= '0' && c <= '9')   ? c - '0'
                    : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                             : 99;
        if (digit >= base) return kNaN;
        value = value * base + digit;
      }
      return value;
    }
  }
  double value = 0;
  size_t used = read_decimal(text, value);
  return used == text.size() ? value : kNaN;
}

bool js_parse_int(std::string_view text, double& value) {
  text = js_trim_start(text);
  size_t pos = 0;
  bool negative = false;
  if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) negative = text[pos++] == '-';
  size_t start = pos;
  double result = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9')
    result = result * 10 + (text[pos++] - '0');
  if (pos == start) return false;
  value = negative ? -result : result;
  return true;
}

bool js_parse_float(std::string_view text, double& value) {
  return read_decimal(js_trim_start(text), value) > 0;
}

}  // namespace pdserve::jinja
