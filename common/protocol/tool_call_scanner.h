// Follows the body of a "<tool_call>" block (the text after the tag) byte by byte while it can
// still be a call: one JSON object with exactly the members "name" (a non-empty string) and
// "arguments" (an object), in either order, nesting at most kMaxJsonDepth levels, with JSON
// whitespace around it. This is what lets a stream send a call's name and its arguments' text
// as they arrive, before the "</tool_call>" that confirms the call.
//
// It rejects a byte only when no continuation can make the body a call that parse_tool_call
// accepts (JSON syntax, a member missing, repeated or of the wrong type, another member, too
// deep), so a rejection is final. It is laxer than the final parse only inside strings: UTF-8
// and surrogate pairs are left to it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve {

class ToolCallBodyScanner {
 public:
  // Reads the body's next byte; false once the body can no longer be a call (and from then on).
  bool consume(char c);

  bool rejected() const { return expect_ == Expect::kRejected; }
  // The decoded name, once its string has closed.
  const std::optional<std::string>& name() const { return name_; }
  // Offset in the body of the arguments' '{', once read.
  std::optional<size_t> arguments_begin() const { return arguments_begin_; }
  // Offset just past the arguments' closing '}', once read.
  std::optional<size_t> arguments_end() const { return arguments_end_; }
  // The object has closed with both members: only whitespace may follow.
  bool object_closed() const { return expect_ == Expect::kTrailingSpace; }

 private:
  enum class Expect {
    kObject,           // the outer '{'
    kKeyOrObjectEnd,   // after '{'
    kKey,              // after ',' in an object
    kColon,            // after a key
    kValue,            // after ':', or after ',' in an array
    kValueOrArrayEnd,  // after '['
    kCommaOrEnd,       // after a value inside an object or array
    kString,
    kStringEscape,
    kUnicodeEscape,
    kNumber,
    kLiteral,
    kTrailingSpace,  // after the outer object
    kRejected,
  };
  // Where a number stands: each part says which characters may come next.
  enum class NumberPart {
    kMinus,
    kZero,
    kInteger,
    kPoint,
    kFraction,
    kExponentMark,
    kExponentSign,
    kExponent
  };
  enum class Member { kNone, kName, kArguments };

  bool reject();
  bool start_value(char c);
  bool open_container(char c);
  bool close_container(char c);
  bool close_string();
  void end_value();
  // Whether `c` continues the number; when it does not, the number has ended there (or the
  // text is not JSON, which reject() records).
  bool continues_number(char c);

  Expect expect_ = Expect::kObject;
  size_t offset_ = 0;  // of the byte being read
  std::string open_;   // the open objects and arrays, outermost first: '{' or '['
  bool string_is_key_ = false;
  int unicode_digits_left_ = 0;
  NumberPart number_ = NumberPart::kMinus;
  std::string_view literal_;  // "true", "false" or "null" while one is read
  size_t literal_matched_ = 0;
  // The outer object's members: the raw text of its key or name string being read (decoded by
  // the JSON parser once it closes), the member whose value comes next, and what was found.
  std::string outer_string_;
  Member member_ = Member::kNone;
  bool saw_name_key_ = false;
  bool saw_arguments_key_ = false;
  std::optional<std::string> name_;
  std::optional<size_t> arguments_begin_;
  std::optional<size_t> arguments_end_;
};

}  // namespace pdserve
