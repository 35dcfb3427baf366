#include "common/protocol/tool_call_scanner.h"

#include <nlohmann/json.hpp>

#include "common/core/json_depth.h"

namespace pdserve {
namespace {

bool is_json_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_hex_digit(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

bool ToolCallBodyScanner::consume(char c) {
  const bool accepted = [&] {
    if (expect_ == Expect::kNumber) {
      if (continues_number(c)) return true;
      if (rejected()) return false;
    }
    switch (expect_) {
      case Expect::kRejected:
        return false;
      case Expect::kObject:
        if (is_json_space(c)) return true;
        return c == '{' ? open_container(c) : reject();
      case Expect::kTrailingSpace:
        return is_json_space(c) || reject();
      case Expect::kKeyOrObjectEnd:
      case Expect::kKey:
        if (is_json_space(c)) return true;
        if (c == '}' && expect_ == Expect::kKeyOrObjectEnd) return close_container(c);
        if (c != '"') return reject();
        string_is_key_ = true;
        if (open_.size() == 1) outer_string_ = "\"";
        expect_ = Expect::kString;
        return true;
      case Expect::kColon:
        if (is_json_space(c)) return true;
        if (c != ':') return reject();
        expect_ = Expect::kValue;
        return true;
      case Expect::kValue:
      case Expect::kValueOrArrayEnd:
        if (is_json_space(c)) return true;
        if (c == ']' && expect_ == Expect::kValueOrArrayEnd) return close_container(c);
        return start_value(c);
      case Expect::kCommaOrEnd:
        if (is_json_space(c)) return true;
        if (c == ',') {
          expect_ = open_.back() == '{' ? Expect::kKey : Expect::kValue;
          return true;
        }
        return close_container(c);
      case Expect::kString:
        if (open_.size() == 1) outer_string_ += c;
        if (c == '"') return close_string();
        if (c == '\\') expect_ = Expect::kStringEscape;
        return static_cast<unsigned char>(c) >= 0x20 || reject();  // control characters
      case Expect::kStringEscape:
        if (open_.size() == 1) outer_string_ += c;
        if (c == 'u') {
          unicode_digits_left_ = 4;
          expect_ = Expect::kUnicodeEscape;
          return true;
        }
        expect_ = Expect::kString;
        return std::string_view("\"\\/bfnrt").find(c) != std::string_view::npos || reject();
      case Expect::kUnicodeEscape:
        if (open_.size() == 1) outer_string_ += c;
        if (!is_hex_digit(c)) return reject();
        if (--unicode_digits_left_ == 0) expect_ = Expect::kString;
        return true;
      case Expect::kLiteral:
        if (c != literal_[literal_matched_]) return reject();
        if (++literal_matched_ == literal_.size()) end_value();
        return true;
      case Expect::kNumber:
        break;  // handled above: a number that has ended hands its byte to kCommaOrEnd
    }
    return reject();
  }();
  ++offset_;
  return accepted;
}

bool ToolCallBodyScanner::reject() {
  expect_ = Expect::kRejected;
  return false;
}

bool ToolCallBodyScanner::start_value(char c) {
  // The outer object's values: only a string for the name and an object for the arguments.
  if (open_.size() == 1) {
    if (member_ == Member::kName && c != '"') return reject();
    if (member_ == Member::kArguments) {
      if (c != '{') return reject();
      arguments_begin_ = offset_;
    }
  }
  switch (c) {
    case '{':
    case '[':
      return open_container(c);
    case '"':
      string_is_key_ = false;
      if (open_.size() == 1) outer_string_ = "\"";
      expect_ = Expect::kString;
      return true;
    case 't':
      literal_ = "true";
      break;
    case 'f':
      literal_ = "false";
      break;
    case 'n':
      literal_ = "null";
      break;
    case '-':
      number_ = NumberPart::kMinus;
      expect_ = Expect::kNumber;
      return true;
    default:
      if (!is_digit(c)) return reject();
      number_ = c == '0' ? NumberPart::kZero : NumberPart::kInteger;
      expect_ = Expect::kNumber;
      return true;
  }
  literal_matched_ = 1;
  expect_ = Expect::kLiteral;
  return true;
}

bool ToolCallBodyScanner::open_container(char c) {
  if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) return reject();
  open_ += c;
  expect_ = c == '{' ? Expect::kKeyOrObjectEnd : Expect::kValueOrArrayEnd;
  return true;
}

bool ToolCallBodyScanner::close_container(char c) {
  if (c != (open_.back() == '{' ? '}' : ']')) return reject();
  open_.pop_back();
  if (open_.empty()) {
    // The outer object: a call needs both members.
    if (!name_ || !arguments_end_) return reject();
    expect_ = Expect::kTrailingSpace;
    return true;
  }
  if (open_.size() == 1 && member_ == Member::kArguments) arguments_end_ = offset_ + 1;
  end_value();
  return true;
}

bool ToolCallBodyScanner::close_string() {
  if (open_.size() != 1) {
    if (string_is_key_) {
      expect_ = Expect::kColon;
    } else {
      end_value();
    }
    return true;
  }
  // A key or the name of the outer object: decoded as the final parse will decode it.
  const nlohmann::json decoded = nlohmann::json::parse(outer_string_, nullptr, false);
  if (decoded.is_discarded()) return reject();
  const std::string& text = decoded.get_ref<const std::string&>();
  if (string_is_key_) {
    if (text == "name" && !saw_name_key_) {
      saw_name_key_ = true;
      member_ = Member::kName;
    } else if (text == "arguments" && !saw_arguments_key_) {
      saw_arguments_key_ = true;
      member_ = Member::kArguments;
    } else {
      return reject();  // another member, or one repeated
    }
    expect_ = Expect::kColon;
    return true;
  }
  if (text.empty()) return reject();
  name_ = text;
  end_value();
  return true;
}

void ToolCallBodyScanner::end_value() {
  expect_ = Expect::kCommaOrEnd;
}

bool ToolCallBodyScanner::continues_number(char c) {
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  const auto next = [&](NumberPart part) {
    number_ = part;
    return true;
  };
  const bool may_end = number_ == NumberPart::kZero || number_ == NumberPart::kInteger ||
                       number_ == NumberPart::kFraction || number_ == NumberPart::kExponent;
  switch (number_) {
    case NumberPart::kMinus:
      if (c == '0') return next(NumberPart::kZero);
      if (is_digit(c)) return next(NumberPart::kInteger);
      break;
    case NumberPart::kInteger:
      if (is_digit(c)) return true;
      [[fallthrough]];
    case NumberPart::kZero:
      if (c == '.') return next(NumberPart::kPoint);
      if (c == 'e' || c == 'E') return next(NumberPart::kExponentMark);
      break;
    case NumberPart::kPoint:
      if (is_digit(c)) return next(NumberPart::kFraction);
      break;
    case NumberPart::kFraction:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') return next(NumberPart::kExponentMark);
      break;
    case NumberPart::kExponentMark:
      if (c == '+' || c == '-') return next(NumberPart::kExponentSign);
      [[fallthrough]];
    case NumberPart::kExponentSign:
      if (is_digit(c)) return next(NumberPart::kExponent);
      break;
    case NumberPart::kExponent:
      if (is_digit(c)) return true;
      break;
  }
  if (may_end) {
    end_value();
  } else {
    reject();
  }
  return false;
}

}  // namespace pdserve
