// Errors inside the template engine: every failure is a pdserve::Error (see status.h) whose
// message starts with the line:column of the template construct that caused it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/core/status.h"

namespace pdserve::jinja {

// An Error whose message already names its template position, so enclosing nodes keep it.
class LocatedError : public Error {
 public:
  using Error::Error;
};

// "line L:C" (1-based, columns in bytes) of a byte offset into the template source.
std::string describe_position(std::string_view source, size_t offset);

[[noreturn]] void throw_at(std::string_view source, size_t offset, StatusCode code,
                           std::string_view message);

// Errors raised without a position (values, builtins); the interpreter adds one.
[[noreturn]] void fail(std::string message);
[[noreturn]] void fail_resource(std::string message);

}  // namespace pdserve::jinja
