#include "common/chat/jinja_lexer.h"

#include <array>
#include <cstdint>
#include <utility>

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_text.h"

namespace pdserve::jinja {
namespace {

// Preprocessed text plus, for every byte, its offset in the original source.
struct MappedText {
  std::string text;
  std::vector<size_t> origin;

  void keep(const MappedText& from, size_t begin, size_t end) {
    text.append(from.text, begin, end - begin);
    origin.insert(origin.end(), from.origin.begin() + static_cast<std::ptrdiff_t>(begin),
                  from.origin.begin() + static_cast<std::ptrdiff_t>(end));
  }
};

bool is_line_terminator_before(std::string_view text, size_t pos) {
  if (pos == 0) return true;
  char c = text[pos - 1];
  if (c == '\n' || c == '\r') return true;
  // U+2028 / U+2029 (E2 80 A8 / E2 80 A9).
  return pos >= 3 && text.substr(pos - 3, 2) == "\xE2\x80" &&
         (text[pos - 1] == '\xA8' || text[pos - 1] == '\xA9');
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1".
MappedText lstrip_blocks(const MappedText& in) {
  MappedText out;
  const std::string& s = in.text;
  size_t kept_until = 0;
  for (size_t pos = 0; pos < s.size(); ++pos) {
    if (!is_line_terminator_before(s, pos)) continue;
    size_t end = pos;
    while (end < s.size() && (s[end] == ' ' || s[end] == '\t')) ++end;
    if (end > pos && end + 1 < s.size() && s[end] == '{' &&
        (s[end + 1] == '#' || s[end + 1] == '%' || s[end + 1] == '-')) {
      out.keep(in, kept_until, pos);
      kept_until = end;
      pos = end;
    }
  }
  out.keep(in, kept_until, s.size());
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
MappedText trim_blocks(const MappedText& in) {
  MappedText out;
  const std::string& s = in.text;
  size_t kept_until = 0;
  for (size_t pos = 0; pos + 2 < s.size(); ++pos) {
    if ((s[pos] == '#' || s[pos] == '%' || s[pos] == '-') && s[pos + 1] == '}' &&
        s[pos + 2] == '\n') {
      out.keep(in, kept_until, pos + 2);
      kept_until = pos + 3;
      pos += 2;
    }
  }
  out.keep(in, kept_until, s.size());
  return out;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t n = js_space_at(s, pos)) pos += n;
  return pos;
}

// Matches {%-? \s* (end)?generation \s* -?%} at `pos`; returns its end or 0.
size_t match_generation_tag(std::string_view s, size_t pos, bool& strip_before, bool& strip_after) {
  if (s.substr(pos, 2) != "{%") return 0;
  pos += 2;
  strip_before = pos < s.size() && s[pos] == '-';
  if (strip_before) ++pos;
  pos = skip_spaces(s, pos);
  if (s.substr(pos, 3) == "end") pos += 3;
  if (s.substr(pos, 10) != "generation") return 0;
  pos = skip_spaces(s, pos + 10);
  strip_after = pos < s.size() && s[pos] == '-';
  if (strip_after) ++pos;
  if (s.substr(pos, 2) != "%}") return 0;
  return pos + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/g: drops the tag, and the surrounding
// whitespace on the sides that carry a '-'.
MappedText remove_generation_tags(const MappedText& in) {
  MappedText out;
  const std::string& s = in.text;
  size_t kept_until = 0;
  size_t previous_match_end = 0;
  for (size_t pos = s.find("{%"); pos != std::string::npos; pos = s.find("{%", pos + 1)) {
    bool strip_before = false;
    bool strip_after = false;
    size_t tag_end = match_generation_tag(s, pos, strip_before, strip_after);
    if (tag_end == 0) continue;
    size_t before = pos;
    while (before > previous_match_end) {
      size_t n = js_space_before(s, before);
      if (n == 0 || before - n < previous_match_end) break;
      before -= n;
    }
    size_t after = skip_spaces(s, tag_end);
    out.keep(in, kept_until, strip_before ? before : pos);
    kept_until = strip_after ? after : tag_end;
    previous_match_end = after;
    pos = after - 1;
  }
  out.keep(in, kept_until, s.size());
  return out;
}

MappedText preprocess(std::string_view source) {
  MappedText text;
  text.text.assign(source);
  if (!text.text.empty() && text.text.back() == '\n') text.text.pop_back();
  text.origin.resize(text.text.size());
  for (size_t i = 0; i < text.origin.size(); ++i) text.origin[i] = i;
  return remove_generation_tags(trim_blocks(lstrip_blocks(text)));
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

constexpr std::array<std::pair<std::string_view, TokenType>, 29> kOperators = {{
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurly},       {"}", TokenType::kCloseCurly},
    {"[", TokenType::kOpenSquare},      {"]", TokenType::kCloseSquare},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
}};

class Lexer {
 public:
  Lexer(std::string_view source, MappedText text)
      : source_(source), text_(std::move(text)), src_(text_.text) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) step();
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t at, std::string_view message) const {
    size_t offset = at < text_.origin.size() ? text_.origin[at] : source_.size();
    throw_at(source_, offset, StatusCode::kInvalidArgument, message);
  }

  void push(TokenType type, std::string value, size_t at) {
    size_t offset = at < text_.origin.size() ? text_.origin[at] : source_.size();
    tokens_.push_back(Token{type, std::move(value), offset});
  }

  bool last_is(std::initializer_list<TokenType> types) const {
    if (tokens_.empty()) return false;
    for (TokenType type : types) {
      if (tokens_.back().type == type) return true;
    }
    return false;
  }

  bool starts_tag(size_t at) const {
    return at + 1 < src_.size() && src_[at] == '{' &&
           (src_[at + 1] == '%' || src_[at + 1] == '{' || src_[at + 1] == '#');
  }

  void strip_trailing_whitespace() {
    if (!last_is({TokenType::kText})) return;
    std::string& value = tokens_.back().value;
    value.resize(js_trim_end(value).size());
    if (value.empty()) tokens_.pop_back();
  }

  void skip_leading_whitespace() { pos_ = skip_spaces(src_, pos_); }

  // Like the reference consumeWhile: "Unexpected end of input" when the input ends inside.
  void require_more(size_t at) const {
    if (at >= src_.size()) error(src_.size(), "unexpected end of template");
  }

  std::string consume_digits() {
    size_t start = pos_;
    while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
    if (pos_ > start) require_more(pos_);
    return std::string(src_.substr(start, pos_ - start));
  }

  void step() {
    if (tokens_.empty() ||
        last_is({TokenType::kCloseStatement, TokenType::kCloseExpression, TokenType::kComment})) {
      size_t start = pos_;
      while (pos_ < src_.size() && !starts_tag(pos_)) ++pos_;
      if (pos_ > start) {
        push(TokenType::kText, std::string(src_.substr(start, pos_ - start)), start);
        return;
      }
    }
    if (src_.substr(pos_, 2) == "{#") {
      lex_comment();
      return;
    }
    if (src_.substr(pos_, 3) == "{%-" || src_.substr(pos_, 3) == "{{-") {
      strip_trailing_whitespace();
      bool statement = src_[pos_ + 1] == '%';
      push(statement ? TokenType::kOpenStatement : TokenType::kOpenExpression,
           statement ? "{%" : "{{", pos_);
      if (!statement) curly_depth_ = 0;
      pos_ += 3;
      return;
    }
    size_t before_space = pos_;
    skip_leading_whitespace();
    if (pos_ > before_space) require_more(pos_);
    if (src_.substr(pos_, 3) == "-%}" || src_.substr(pos_, 3) == "-}}") {
      bool statement = src_[pos_ + 1] == '%';
      push(statement ? TokenType::kCloseStatement : TokenType::kCloseExpression,
           statement ? "%}" : "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }
    char c = src_[pos_];
    if ((c == '-' || c == '+') && lex_sign(c)) return;
    for (const auto& [sequence, type] : kOperators) {
      if (sequence == "}}" && curly_depth_ > 0) continue;
      if (src_.substr(pos_, sequence.size()) != sequence) continue;
      push(type, std::string(sequence), pos_);
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenCurly) ++curly_depth_;
      if (type == TokenType::kCloseCurly) --curly_depth_;
      pos_ += sequence.size();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    if (is_digit(c)) {
      size_t start = pos_;
      std::string number = consume_digits();
      if (!last_is({TokenType::kDot}) && pos_ + 1 < src_.size() && src_[pos_] == '.' &&
          is_digit(src_[pos_ + 1])) {
        ++pos_;
        number += "." + consume_digits();
      }
      push(TokenType::kNumber, std::move(number), start);
      return;
    }
    if (is_word(c)) {
      size_t start = pos_;
      while (pos_ < src_.size() && is_word(src_[pos_])) ++pos_;
      require_more(pos_);
      push(TokenType::kIdentifier, std::string(src_.substr(start, pos_ - start)), start);
      return;
    }
    error(pos_, "unexpected character '" + std::string(1, c) + "'");
  }

  // A '+'/'-' that cannot be binary (after an operator or an opening bracket) is a sign: it
  // becomes part of a number literal, or a unary operator token. Returns false when binary.
  bool lex_sign(char sign) {
    if (tokens_.empty() || last_is({TokenType::kText})) {
      error(pos_, "unexpected character '" + std::string(1, sign) + "'");
    }
    if (last_is({TokenType::kIdentifier, TokenType::kNumber, TokenType::kString,
                 TokenType::kCloseParen, TokenType::kCloseSquare})) {
      return false;
    }
    size_t start = pos_++;
    std::string number = consume_digits();
    if (!number.empty() && pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        is_digit(src_[pos_ + 1])) {
      ++pos_;
      number += "." + consume_digits();
    }
    bool numeric = !number.empty();
    push(numeric ? TokenType::kNumber : TokenType::kUnary, std::string(1, sign) + number, start);
    return true;
  }

  void lex_comment() {
    size_t start = pos_;
    pos_ += 2;
    bool strip_before = pos_ < src_.size() && src_[pos_] == '-';
    if (strip_before) ++pos_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) error(start, "missing end of comment tag '#}'");
    std::string body(src_.substr(pos_, end - pos_));
    bool strip_after = !body.empty() && body.back() == '-';
    if (strip_after) body.pop_back();
    if (strip_before) strip_trailing_whitespace();
    push(TokenType::kComment, std::move(body), start);
    pos_ = end + 2;
    if (strip_after) skip_leading_whitespace();
  }

  void lex_string(char quote) {
    size_t start = pos_++;
    std::string value;
    while (true) {
      require_more(pos_);
      char c = src_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++pos_;
        continue;
      }
      require_more(++pos_);
      char escaped = src_[pos_++];
      if (escaped == 'x' || escaped == 'u') {
        value += read_hex_escape(escaped);
        continue;
      }
      switch (escaped) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\\':
          value += '\\';
          break;
        default:
          error(pos_ - 2, "unexpected escaped character '" + std::string(1, escaped) + "'");
      }
    }
    ++pos_;
    push(TokenType::kString, std::move(value), start);
  }

  // \xHH or \uHHHH (UTF-16 units; a surrogate pair written as two escapes forms one character).
  std::string read_hex_escape(char kind) {
    size_t length = kind == 'x' ? 2 : 4;
    auto read_unit = [&](size_t at, char32_t& unit) {
      if (at + length > src_.size()) return false;
      unit = 0;
      for (size_t i = 0; i < length; ++i) {
        char h = src_[at + i];
        int digit = is_digit(h)              ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
        if (digit < 0) return false;
        unit = unit * 16 + static_cast<char32_t>(digit);
      }
      return true;
    };
    char32_t unit = 0;
    if (!read_unit(pos_, unit)) error(pos_ - 2, "invalid hexadecimal escape sequence");
    pos_ += length;
    char32_t low = 0;
    if (kind == 'u' && unit >= 0xD800 && unit <= 0xDBFF && src_.substr(pos_, 2) == "\\u" &&
        read_unit(pos_ + 2, low) && low >= 0xDC00 && low <= 0xDFFF) {
      pos_ += 6;
      unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
    }
    std::string out;
    append_utf8(out, unit);  // a lone surrogate becomes U+FFFD
    return out;
  }

  std::string_view source_;
  MappedText text_;
  std::string_view src_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(source, preprocess(source)).run();
}

}  // namespace pdserve::jinja
