// Converts JSON (nlohmann::json or ordered_json) into template values the way JavaScript's
// JSON.parse + Object.entries would hand them to the reference engine: integral numbers become
// integers, and integer-like object keys ("0", "12") come first in ascending order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/chat/jinja_error.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

// True for canonical array-index keys ("0", "7", "42"; not "07" or "-1"), which JavaScript
// objects enumerate before all other keys.
inline bool is_array_index_key(const std::string& key, uint64_t& index) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return false;
  index = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    index = index * 10 + static_cast<uint64_t>(c - '0');
  }
  return index < 4294967295ull;
}

template <typename Json>
Value value_from_json(const Json& json, int depth = 0) {
  if (depth > kMaxValueDepth)
    fail_resource("context JSON nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  switch (json.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value::boolean(json.template get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(json.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t value = json.template get<uint64_t>();
      if (value <= static_cast<uint64_t>(INT64_MAX))
        return Value::integer(static_cast<int64_t>(value));
      return Value::floating(static_cast<double>(value));
    }
    case Json::value_t::number_float: {
      double value = json.template get<double>();
      // JavaScript has one number type; the reference treats integral numbers as integers.
      if (std::isfinite(value) && std::floor(value) == value && std::fabs(value) < 9.2e18) {
        return Value::integer(static_cast<int64_t>(value));
      }
      return Value::floating(value);
    }
    case Json::value_t::string:
      return Value::string(json.template get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(value_from_json(item, depth + 1));
      return Value::array(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<uint64_t, const std::string*>> index_keys;
      for (auto it = json.begin(); it != json.end(); ++it) {
        uint64_t index = 0;
        if (is_array_index_key(it.key(), index)) index_keys.emplace_back(index, &it.key());
      }
      std::sort(index_keys.begin(), index_keys.end());
      Object object;
      for (const auto& [index, key] : index_keys)
        object.set(*key, value_from_json(json.at(*key), depth + 1));
      for (auto it = json.begin(); it != json.end(); ++it) {
        uint64_t index = 0;
        if (!is_array_index_key(it.key(), index))
          object.set(it.key(), value_from_json(it.value(), depth + 1));
      }
      return Value::object(std::move(object));
    }
    default:
      fail("unsupported JSON value in the template context");
  }
}

}  // namespace pdserve::jinja
