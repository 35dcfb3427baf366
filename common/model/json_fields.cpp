#include "common/model/json_fields.h"

#include <limits>

#include "common/core/status.h"

namespace pdserve::json_fields {
namespace {

const nlohmann::json* find(const Source& src, const char* key) {
  auto it = src.object.find(key);
  if (it == src.object.end() || it->is_null()) return nullptr;
  return &*it;
}

int to_int(const Source& src, const char* key, const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    auto v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      fail(src, key, "is out of range (" + value.dump() + ")");
    }
    return static_cast<int>(v);
  }
  if (value.is_number_integer()) {
    auto v = value.get<int64_t>();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      fail(src, key, "is out of range (" + value.dump() + ")");
    }
    return static_cast<int>(v);
  }
  fail(src, key, "must be an integer, got " + value.dump());
}

}  // namespace

void fail(const Source& src, const char* key, const std::string& problem) {
  PDS_THROW(StatusCode::kInvalidArgument, src.name + ": key '" + key + "' " + problem);
}

std::optional<int> optional_int(const Source& src, const char* key) {
  const nlohmann::json* value = find(src, key);
  if (value == nullptr) return std::nullopt;
  return to_int(src, key, *value);
}

std::optional<double> optional_number(const Source& src, const char* key) {
  const nlohmann::json* value = find(src, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) fail(src, key, "must be a number, got " + value->dump());
  return value->get<double>();
}

std::optional<bool> optional_bool(const Source& src, const char* key) {
  const nlohmann::json* value = find(src, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) fail(src, key, "must be true or false, got " + value->dump());
  return value->get<bool>();
}

std::optional<std::string> optional_string(const Source& src, const char* key) {
  const nlohmann::json* value = find(src, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) fail(src, key, "must be a string, got " + value->dump());
  return value->get<std::string>();
}

int required_int(const Source& src, const char* key) {
  std::optional<int> value = optional_int(src, key);
  if (!value) fail(src, key, "is missing");
  return *value;
}

double required_number(const Source& src, const char* key) {
  std::optional<double> value = optional_number(src, key);
  if (!value) fail(src, key, "is missing");
  return *value;
}

std::vector<int> int_or_int_list(const Source& src, const char* key) {
  const nlohmann::json* value = find(src, key);
  if (value == nullptr) return {};
  if (!value->is_array()) return {to_int(src, key, *value)};
  std::vector<int> ids;
  for (const nlohmann::json& element : *value) ids.push_back(to_int(src, key, element));
  return ids;
}

}  // namespace pdserve::json_fields
