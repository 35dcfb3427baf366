#include "common/protocol/request_fields.h"

#include <cmath>
#include <limits>
#include <utility>

namespace pdserve::request_fields {

[[noreturn]] void fail(std::string message, const std::string& param) {
  std::optional<std::string> named;
  if (!param.empty()) named = param;
  throw RequestError{invalid_request(std::move(message), std::move(named))};
}

std::string type_name(const Json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

[[noreturn]] void fail_type(const std::string& param, const char* expected, const Json& got) {
  fail("Invalid type for '" + param + "': expected " + expected + ", but got " + type_name(got) +
           " instead.",
       param);
}

std::string number_text(double value) {
  Json number = value;
  return number.dump();
}

bool is_integral(const Json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double number = value.get<double>();
  return std::isfinite(number) && std::floor(number) == number;
}

bool fits_int64(const Json& integer, int64_t& out) {
  if (integer.is_number_float()) {
    const double number = integer.get<double>();
    // 2^63 is exactly representable; every double below it converts without overflow.
    if (!(number >= -9223372036854775808.0 && number < 9223372036854775808.0)) return false;
    out = static_cast<int64_t>(number);
    return true;
  }
  if (integer.is_number_unsigned() &&
      integer.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  out = integer.get<int64_t>();
  return true;
}

}  // namespace pdserve::request_fields
