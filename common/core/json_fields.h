// Reads the typed fields of one JSON object, remembering the first problem as an
// InvalidArgument that names where and which field (the parsers of inter-process messages).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

// Reads the fields of one JSON object, remembering the first problem.
class FieldReader {
 public:
  using Json = nlohmann::json;

  FieldReader(const Json& object, std::string where) : object_(object), where_(std::move(where)) {}

  template <typename T>
  T get(const char* name, T fallback, bool required = true) {
    const auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) fail(std::string("'") + name + "' is missing");
      return fallback;
    }
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return fail_type(name, "a boolean", fallback);
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) return fail_type(name, "an integer", fallback);
      if (it->is_number_unsigned()
              ? it->template get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())
              : (it->template get<int64_t>() <
                     static_cast<int64_t>(std::numeric_limits<T>::min()) ||
                 (std::is_signed_v<T> &&
                  it->template get<int64_t>() >
                      static_cast<int64_t>(std::numeric_limits<T>::max())))) {
        return fail_type(name, "an integer in range", fallback);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) return fail_type(name, "a number", fallback);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return fail_type(name, "a string", fallback);
    }
    return it->template get<T>();
  }

  std::vector<int32_t> get_ids(const char* name) {
    std::vector<int32_t> ids;
    const auto it = object_.find(name);
    if (it == object_.end() || !it->is_array()) {
      fail(std::string("'") + name + "' must be an array of integers");
      return ids;
    }
    ids.reserve(it->size());
    for (const Json& value : *it) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        fail(std::string("'") + name + "' must hold non-negative 32-bit integers");
        return {};
      }
      ids.push_back(value.get<int32_t>());
    }
    return ids;
  }

  // Fills `out` from an array of exactly out.size() unsigned integers. False when the field is
  // absent or null (a problem only when `required`) or malformed (always a problem).
  bool get_u64s(const char* name, std::span<uint64_t> out, bool required = true) {
    const auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) fail(std::string("'") + name + "' is missing");
      return false;
    }
    const std::string must = std::string("'") + name + "' must hold " +
                             std::to_string(out.size()) + " unsigned integers";
    if (!it->is_array() || it->size() != out.size()) {
      fail(must);
      return false;
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (!(*it)[i].is_number_unsigned()) {
        fail(must);
        return false;
      }
      out[i] = (*it)[i].template get<uint64_t>();
    }
    return true;
  }

  const Json* object(const char* name) {
    const auto it = object_.find(name);
    if (it == object_.end() || !it->is_object()) {
      fail(std::string("'") + name + "' must be an object");
      return nullptr;
    }
    return &*it;
  }

  void fail(std::string message) {
    if (status_.ok()) status_ = invalid_argument(where_ + ": " + std::move(message));
  }
  const Status& status() const { return status_; }

 private:
  template <typename T>
  T fail_type(const char* name, const char* what, T fallback) {
    fail(std::string("'") + name + "' must be " + what);
    return fallback;
  }

  const Json& object_;
  std::string where_;
  Status status_;
};

}  // namespace pdserve
