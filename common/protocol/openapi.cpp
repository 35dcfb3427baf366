#include "common/protocol/openapi.h"

#include <algorithm>
#include <cctype>

#include "common/protocol/openapi_source.h"

namespace pdserve {

nlohmann::ordered_json openapi_document(
    const std::vector<std::pair<std::string, std::string>>& operations, const OpenApiFacts& facts) {
  // Parsed once: the source is a compile-time constant that a unit test checks.
  static const nlohmann::ordered_json kDocument = nlohmann::ordered_json::parse(kOpenApiSource);
  nlohmann::ordered_json document = kDocument;
  nlohmann::ordered_json paths = nlohmann::ordered_json::object();
  for (const auto& [method, path] : operations) {
    std::string key = method;
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const auto& [described, operations_of_path] : kDocument["paths"].items()) {
      // A templated path ("/v1/models/{model}") is served by the prefix route before its first
      // parameter ("/v1/models/").
      const size_t parameter = described.find('{');
      const bool serves = described == path || (parameter != std::string::npos &&
                                                described.substr(0, parameter) == path);
      if (!serves) continue;
      auto operation = operations_of_path.find(key);
      if (operation != operations_of_path.end()) paths[described][key] = *operation;
    }
  }
  document["paths"] = std::move(paths);
  nlohmann::ordered_json& schemas = document["components"]["schemas"];
  if (!facts.model_names.empty()) schemas["ModelName"]["enum"] = facts.model_names;
  if (facts.vocab_size) schemas["TokenId"]["maximum"] = *facts.vocab_size - 1;
  return document;
}

}  // namespace pdserve
