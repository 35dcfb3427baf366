// quantization_config in config.json: Qwen's FP8 form and the refusals that name the field.
#include "common/model/quantization_config.h"

#include <gtest/gtest.h>

#include "common/model/model_config.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::read_json;

// Qwen3-8B-FP8's config.json, as published.
const nlohmann::json kQwenFp8 = nlohmann::json::parse(R"({"activation_scheme": "dynamic",
    "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})");

Result<ModelConfig> parse_with(const nlohmann::json& quantization) {
  nlohmann::json config = read_json(testing::kTinyConfig);
  config["quantization_config"] = quantization;
  return parse_model_config(config, "config.json");
}

TEST(QuantizationConfig, AbsentMeansUnquantized) {
  Result<ModelConfig> config = load_model_config(testing::kTinyConfig);
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(config->quantization.has_value());
  EXPECT_FALSE(parse_with(nullptr)->quantization.has_value());
}

TEST(QuantizationConfig, ReadsQwensBlockFp8) {
  Result<ModelConfig> config = parse_with(kQwenFp8);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ASSERT_TRUE(config->quantization.has_value());
  EXPECT_TRUE(config->quantization->block_scaled());
  EXPECT_EQ(config->quantization->block_n, 128);
  EXPECT_EQ(config->quantization->block_k, 128);
}

TEST(QuantizationConfig, WithoutBlockSizeTheScaleTensorsDecide) {
  Result<ModelConfig> config = parse_with({{"quant_method", "fp8"}});
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_FALSE(config->quantization->block_scaled());
}

TEST(QuantizationConfig, RefusesWhatIsNotImplementedNamingTheField) {
  struct Case {
    const char* key;
    nlohmann::json value;
    StatusCode code;
    const char* mention;
  };
  for (const Case& c :
       {Case{"activation_scheme", "static", StatusCode::kUnimplemented, "static"},
        Case{"weight_block_size", nlohmann::json::array({64, 64}), StatusCode::kUnimplemented,
             "[64,64]"},
        Case{"weight_block_size", nlohmann::json::array({128}), StatusCode::kInvalidArgument,
             "[128]"},
        Case{"weight_block_size", nlohmann::json::array({0, 128}), StatusCode::kInvalidArgument,
             "positive"},
        Case{"quant_method", "awq", StatusCode::kUnimplemented, "awq"},
        Case{"fmt", "e5m2", StatusCode::kUnimplemented, "e5m2"},
        Case{"activation_scheme", "sometimes", StatusCode::kInvalidArgument, "sometimes"},
        Case{"quant_method", nullptr, StatusCode::kInvalidArgument, "missing"}}) {
    nlohmann::json quantization = kQwenFp8;
    quantization[c.key] = c.value;
    Result<ModelConfig> config = parse_with(quantization);
    EXPECT_EQ(config.status().code(), c.code) << c.key << ": " << config.status().to_string();
    expect_error_mentions(config.status(),
                          {"config.json", std::string("quantization_config.") + c.key, c.mention});
  }
  expect_error_mentions(parse_with("fp8").status(), {"quantization_config", "object"});
}

}  // namespace
}  // namespace pdserve
