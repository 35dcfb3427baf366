#include "common/sampling/generation_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdserve {
namespace {

TEST(GenerationConfig, LoadsTheVendoredQwen3Configs) {
  for (const char* model : {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"}) {
    SCOPED_TRACE(model);
    Result<GenerationConfig> config = load_generation_config(std::string(PDSERVE_ASSETS_DIR) + "/" +
                                                             model + "/generation_config.json");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{151645, 151643}));
    EXPECT_EQ(config->sampling.temperature, 0.6f);
    EXPECT_EQ(config->sampling.top_p, 0.95f);
    EXPECT_EQ(config->sampling.top_k, 20);
    EXPECT_FALSE(config->sampling.min_p.has_value());
    EXPECT_FALSE(config->sampling.repetition_penalty.has_value());
  }
}

TEST(GenerationConfig, AcceptsASingleEosIdAndNulls) {
  auto json = nlohmann::json::parse(R"({"eos_token_id": 2, "temperature": null, "min_p": 0.05})");
  Result<GenerationConfig> config = parse_generation_config(json, "inline");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_FALSE(config->sampling.temperature.has_value());
  EXPECT_EQ(config->sampling.min_p, 0.05f);
}

TEST(GenerationConfig, RejectsBadValuesNamingSourceAndKey) {
  struct Case {
    const char* json;
    const char* key;
  };
  for (const Case& c :
       {Case{R"({"eos_token_id": "x"})", "eos_token_id"},
        Case{R"({"eos_token_id": [1, -4]})", "eos_token_id[1]"},
        Case{R"({"eos_token_id": 3000000000})", "eos_token_id"},
        Case{R"({"temperature": "hot"})", "temperature"}, Case{R"({"top_p": 1.5})", "top_p"},
        Case{R"({"top_k": 2.5})", "top_k"}, Case{R"({"top_k": -3})", "top_k"},
        Case{R"({"repetition_penalty": 0})", "repetition_penalty"}}) {
    SCOPED_TRACE(c.json);
    Result<GenerationConfig> config =
        parse_generation_config(nlohmann::json::parse(c.json), "gen.json");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("gen.json"), std::string::npos);
    EXPECT_NE(config.status().message().find(c.key), std::string::npos)
        << config.status().message();
  }
  EXPECT_FALSE(parse_generation_config(nlohmann::json::array(), "gen.json").ok());
}

TEST(GenerationConfig, MissingFileIsNotFound) {
  Result<GenerationConfig> config = load_generation_config("/nonexistent/generation_config.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve
