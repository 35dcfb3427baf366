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
    auto described = kDocument["paths"].find(path);
    if (described == kDocument["paths"].end()) continue;
    std::string key = method;
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    auto operation = described->find(key);
    if (operation != described->end()) paths[path][key] = *operation;
  }
  document["paths"] = std::move(paths);
  nlohmann::ordered_json& schemas = document["components"]["schemas"];
  if (!facts.model_names.empty()) schemas["ModelName"]["enum"] = facts.model_names;
  if (facts.vocab_size) schemas["TokenId"]["maximum"] = *facts.vocab_size - 1;
  return document;
}

}  // namespace pdserve
