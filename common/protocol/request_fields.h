// The field reader under the OpenAI request parsers (openai_request.cpp and its chat and
// structured-output parts): typed reads of one JSON object that name the offending field in
// their 400, and remember which fields were read so the rest can be reported. Private to
// common/protocol.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol/openai_error.h"

namespace pdserve::request_fields {

using Json = nlohmann::ordered_json;

// Thrown deep inside the parser and caught at the public entry points (the module's
// exception policy, carrying an ApiError so that the offending field is named).
struct RequestError {
  ApiError error;
};

[[noreturn]] void fail(std::string message, const std::string& param);

std::string type_name(const Json& value);

[[noreturn]] void fail_type(const std::string& param, const char* expected, const Json& got);

std::string number_text(double value);

// JSON Schema's integer: a number without a fractional part, 16 as well as 16.0 (pydantic's
// lax mode, which vLLM validates with, accepts both too).
bool is_integral(const Json& value);

// An integral JSON number as int64; false when it does not fit (above INT64_MAX, which JSON
// keeps as unsigned, or a float outside the int64 range).
bool fits_int64(const Json& integer, int64_t& out);

// Reads the fields of one JSON object, remembering which were read so that the rest can be
// reported as unrecognized.
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  std::string param(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // The value of `key`, or nullptr when it is absent or null.
  const Json* get(std::string_view key) {
    read_.insert(std::string(key));
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const Json& require(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) fail("Missing required parameter: '" + param(key) + "'.", param(key));
    return *value;
  }

  std::optional<bool> boolean(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) fail_type(param(key), "a boolean", *value);
    return value->get<bool>();
  }

  std::optional<std::string> string(std::string_view key) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) fail_type(param(key), "a string", *value);
    return value->get<std::string>();
  }

  // A finite number in [min, max]; `allowed` describes the range for the message.
  std::optional<double> number(std::string_view key, double min, double max, const char* allowed) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) fail_type(param(key), "a number", *value);
    double number = value->get<double>();
    if (!(std::isfinite(number) && number >= min && number <= max)) {
      fail("Invalid value for '" + param(key) + "': " + number_text(number) +
               " is out of range (allowed: " + allowed + ").",
           param(key));
    }
    return number;
  }

  std::optional<int64_t> integer(std::string_view key, int64_t min, int64_t max,
                                 const char* allowed) {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    return checked_integer(*value, param(key), min, max, allowed);
  }

  // Fields that were not read: a 400 naming the first.
  void reject_unread() const {
    for (const std::string& key : unread()) {
      fail("Unrecognized request argument supplied: " + param(key), param(key));
    }
  }

  std::vector<std::string> unread() const {
    std::vector<std::string> keys;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!read_.contains(it.key())) keys.push_back(it.key());
    }
    return keys;
  }

  static int64_t checked_integer(const Json& value, const std::string& param, int64_t min,
                                 int64_t max, const char* allowed) {
    if (!is_integral(value)) fail_type(param, "an integer", value);
    int64_t number = 0;
    bool in_range = fits_int64(value, number) && number >= min && number <= max;
    if (!in_range) {
      fail("Invalid value for '" + param + "': " + value.dump() +
               " is out of range (allowed: " + allowed + ").",
           param);
    }
    return number;
  }

 private:
  const Json& object_;
  std::string path_;
  std::set<std::string, std::less<>> read_;
};

// Runs a parser body, turning its RequestError (or an allocation failure) into an ApiError.
template <typename T, typename Fn>
ApiResult<T> capture_api_error(Fn&& fn) {
  try {
    return fn();
  } catch (const RequestError& e) {
    return e.error;
  } catch (const std::bad_alloc&) {
    return internal_server_error("out of memory while parsing the request");
  } catch (const std::exception& e) {
    return internal_server_error(std::string("while parsing the request: ") + e.what());
  }
}

}  // namespace pdserve::request_fields
