// The OpenAPI 3.1 description of the public API (common/protocol/openapi.json, compiled in):
// each server serves the operations it has, with what it knows of its model filled in.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve {

struct OpenApiFacts {
  std::vector<std::string> model_names;  // empty: any name (the 404 says which are served)
  std::optional<int> vocab_size;         // bounds TokenId when known
};

// The document restricted to `operations` ((method, path) pairs, a prefix route's path being
// its prefix, which serves the templated path that starts with it; those it does not describe,
// such as internal endpoints, are left out), with ModelName limited to facts.model_names and
// TokenId to [0, vocab_size).
nlohmann::ordered_json openapi_document(
    const std::vector<std::pair<std::string, std::string>>& operations, const OpenApiFacts& facts);

}  // namespace pdserve
