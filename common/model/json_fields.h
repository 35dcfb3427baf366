// Typed, validated reads of JSON object fields for config parsers. They throw pdserve::Error
// (module-internal) with a message naming the source and the key; public entry points convert
// with capture_status().
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve::json_fields {

// Context for messages: "<source>: key '<key>' ...".
struct Source {
  const nlohmann::json& object;
  const std::string& name;
};

// A field that is absent or null yields std::nullopt; a field of the wrong type is an error.
std::optional<int> optional_int(const Source& src, const char* key);
std::optional<double> optional_number(const Source& src, const char* key);
std::optional<bool> optional_bool(const Source& src, const char* key);
std::optional<std::string> optional_string(const Source& src, const char* key);

int required_int(const Source& src, const char* key);
double required_number(const Source& src, const char* key);

// A token id field that may be an int or a list of ints (eos_token_id); absent -> empty.
std::vector<int> int_or_int_list(const Source& src, const char* key);

[[noreturn]] void fail(const Source& src, const char* key, const std::string& problem);

}  // namespace pdserve::json_fields
