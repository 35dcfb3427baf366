// The compiled-in OpenAPI document: valid JSON, OpenAPI 3.1, every $ref resolves, and each
// server's copy holds exactly its public operations with its model facts filled in.
#include "common/protocol/openapi.h"

#include <functional>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;

const std::vector<std::pair<std::string, std::string>> kEverything = {
    {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"},
    {"POST", "/v1/responses"},   {"POST", "/v1/messages"},
    {"POST", "/v1/messages/count_tokens"},
    {"GET", "/v1/models"},       {"GET", "/v1/models/"},
    {"POST", "/tokenize"},       {"POST", "/detokenize"},
    {"GET", "/health"},          {"GET", "/ready"},
    {"GET", "/version"},         {"GET", "/metrics"},
    {"GET", "/openapi.json"}};

// Every "$ref" in `node`, as JSON pointers.
void collect_refs(const Json& node, std::set<std::string>& refs) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if (key == "$ref" && value.is_string()) refs.insert(value.get<std::string>());
      collect_refs(value, refs);
    }
  } else if (node.is_array()) {
    for (const Json& item : node) collect_refs(item, refs);
  }
}

TEST(OpenApi, IsOpenApi31AndEveryReferenceResolves) {
  Json document = openapi_document(kEverything, {});
  EXPECT_EQ(document["openapi"], "3.1.0");
  EXPECT_EQ(document["paths"].size(), 14u);
  std::set<std::string> refs;
  collect_refs(document, refs);
  ASSERT_FALSE(refs.empty());
  for (const std::string& ref : refs) {
    ASSERT_TRUE(ref.starts_with("#/")) << ref;
    EXPECT_TRUE(document.contains(Json::json_pointer(ref.substr(1)))) << ref << " does not resolve";
  }
}

TEST(OpenApi, HoldsOnlyTheOperationsTheServerHas) {
  Json document = openapi_document({{"GET", "/health"},
                                    {"POST", "/internal/v1/prefill"},
                                    {"DELETE", "/health"},
                                    {"GET", "/openapi.json"}},
                                   {});
  std::set<std::string> operations;
  for (const auto& [path, methods] : document["paths"].items()) {
    for (const auto& [method, operation] : methods.items()) operations.insert(method + " " + path);
  }
  EXPECT_EQ(operations, (std::set<std::string>{"get /health", "get /openapi.json"}));
}

// A prefix route ("/v1/models/") serves the templated path that starts with it; other prefix
// routes ("/cluster/nodes/") are not described.
TEST(OpenApi, APrefixRouteServesItsTemplatedPath) {
  Json document = openapi_document(
      {{"GET", "/v1/models/"}, {"POST", "/cluster/nodes/"}, {"GET", "/v1/models"}}, {});
  std::set<std::string> paths;
  for (const auto& [path, methods] : document["paths"].items()) paths.insert(path);
  EXPECT_EQ(paths, (std::set<std::string>{"/v1/models", "/v1/models/{model}"}));
}

TEST(OpenApi, FillsTheServedModelAndVocabulary) {
  Json open = openapi_document(kEverything, {});
  EXPECT_FALSE(open["components"]["schemas"]["ModelName"].contains("enum"));
  EXPECT_FALSE(open["components"]["schemas"]["TokenId"].contains("maximum"));
  Json filled = openapi_document(kEverything, {{"qwen3-tiny"}, 1000});
  EXPECT_EQ(filled["components"]["schemas"]["ModelName"]["enum"], Json::array({"qwen3-tiny"}));
  EXPECT_EQ(filled["components"]["schemas"]["TokenId"]["maximum"], 999);
}

}  // namespace
}  // namespace pdserve
