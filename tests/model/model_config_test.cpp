// load_model_config and load_generation_config: the vendored real configs and refusals.
#include "common/model/model_config.h"

#include <gtest/gtest.h>

#include "common/model/generation_config.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::read_json;
using testing::TempDir;
using testing::write_json;

const std::filesystem::path kAssets = PDSERVE_ASSETS_DIR;

struct Expected {
  const char* folder;
  int hidden, intermediate, layers, heads, kv_heads;
  bool tied;
};

// Figures from the Qwen3 model cards (the vendored configs are the published ones).
TEST(ModelConfig, ParsesTheFourVendoredQwen3Configs) {
  for (const Expected& e : {Expected{"qwen3-0.6b", 1024, 3072, 28, 16, 8, true},
                            Expected{"qwen3-1.7b", 2048, 6144, 28, 16, 8, true},
                            Expected{"qwen3-4b", 2560, 9728, 36, 32, 8, true},
                            Expected{"qwen3-8b", 4096, 12288, 36, 32, 8, false}}) {
    Result<ModelConfig> config = load_model_config(kAssets / e.folder / "config.json");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    EXPECT_EQ(config->architecture, "Qwen3ForCausalLM");
    EXPECT_EQ(config->vocab_size, 151936) << e.folder;
    EXPECT_EQ(config->hidden_size, e.hidden) << e.folder;
    EXPECT_EQ(config->intermediate_size, e.intermediate) << e.folder;
    EXPECT_EQ(config->num_hidden_layers, e.layers) << e.folder;
    EXPECT_EQ(config->num_attention_heads, e.heads) << e.folder;
    EXPECT_EQ(config->num_key_value_heads, e.kv_heads) << e.folder;
    EXPECT_EQ(config->head_dim, 128) << e.folder;
    EXPECT_EQ(config->tie_word_embeddings, e.tied) << e.folder;
    EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-6f);
    EXPECT_EQ(config->rope_theta, 1e6);
    EXPECT_EQ(config->max_position_embeddings, 40960);
    EXPECT_EQ(config->torch_dtype, DType::kBF16);
    EXPECT_EQ(config->bos_token_id, 151643);
    EXPECT_EQ(config->eos_token_ids, std::vector<int>{151645});
  }
}

class ConfigEdits : public ::testing::Test {
 protected:
  // Writes the tiny config with `edit` applied and loads it.
  template <typename Edit>
  Result<ModelConfig> load_edited(Edit edit) {
    nlohmann::json config = read_json(testing::kTinyConfig);
    edit(config);
    write_json(dir_ / "config.json", config);
    return load_model_config(dir_ / "config.json");
  }
  std::string path() const { return (dir_ / "config.json").string(); }
  TempDir dir_;
};

TEST_F(ConfigEdits, HeadDimDefaultsToHiddenOverHeads) {
  Result<ModelConfig> config = load_edited([](nlohmann::json& c) { c.erase("head_dim"); });
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->head_dim, 16);
  config = load_edited([](nlohmann::json& c) {
    c.erase("head_dim");
    c["num_attention_heads"] = 6;
    c["num_key_value_heads"] = 3;
  });
  expect_error_mentions(config.status(), {path(), "head_dim"});
}

TEST_F(ConfigEdits, EosMayBeAListAndDtypeMayBeCalledDtype) {
  Result<ModelConfig> config = load_edited([](nlohmann::json& c) {
    c["eos_token_id"] = {151645, 151643};
    c.erase("torch_dtype");
    c["dtype"] = "float16";
    c["bos_token_id"] = nullptr;
  });
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->eos_token_ids, (std::vector<int>{151645, 151643}));
  EXPECT_EQ(config->torch_dtype, DType::kF16);
  EXPECT_FALSE(config->bos_token_id.has_value());
}

TEST_F(ConfigEdits, RefusesOtherArchitecturesByName) {
  expect_error_mentions(
      load_edited([](nlohmann::json& c) { c["architectures"] = {"Qwen2ForCausalLM"}; }).status(),
      {path(), "architectures", "Qwen2ForCausalLM"});
  expect_error_mentions(load_edited([](nlohmann::json& c) { c.erase("architectures"); }).status(),
                        {path(), "architectures"});
}

TEST_F(ConfigEdits, RefusesUnimplementedFeatures) {
  struct Case {
    const char* key;
    nlohmann::json value;
  };
  for (const Case& c : {Case{"hidden_act", "gelu"}, Case{"attention_bias", true},
                        Case{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}},
                        Case{"use_sliding_window", true}}) {
    Result<ModelConfig> config = load_edited([&](nlohmann::json& j) { j[c.key] = c.value; });
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.key;
    expect_error_mentions(config.status(), {path(), c.key});
  }
}

// transformers >= 5 writes rope_parameters and layer_types (the committed config of
// tests/data/reference/transformers_qwen3_0_6b_2layers.config.json is one such file).
TEST_F(ConfigEdits, AcceptsTransformers5RopeParametersAndLayerTypes) {
  Result<ModelConfig> config = load_edited([](nlohmann::json& j) {
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
    j["layer_types"] = nlohmann::json::array();
    for (int i = 0; i < j["num_hidden_layers"].get<int>(); ++i) j["layer_types"].push_back("full_attention");
  });
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->rope_theta, 5e5);
  struct Case {
    nlohmann::json rope_parameters;
    nlohmann::json layer_types;
    const char* key;
    const char* says;
  };
  for (const Case& c : {Case{{{"rope_theta", 1e6}, {"rope_type", "yarn"}}, nullptr, "rope_parameters",
                             "not implemented"},
                        Case{{{"rope_type", "default"}}, nullptr, "rope_parameters", "rope_theta"},
                        Case{"fast", nullptr, "rope_parameters", "object"},
                        Case{nullptr, {"full_attention", "sliding_attention"}, "layer_types",
                             "only full_attention"}}) {
    Result<ModelConfig> edited = load_edited([&](nlohmann::json& j) {
      if (!c.rope_parameters.is_null()) j["rope_parameters"] = c.rope_parameters;
      if (!c.layer_types.is_null()) j["layer_types"] = c.layer_types;
    });
    expect_error_mentions(edited.status(), {path(), std::string("'") + c.key + "'", c.says});
  }
}

TEST_F(ConfigEdits, ValidatesNumbers) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Case& c :
       {Case{"hidden_size", 0, "positive"}, Case{"vocab_size", -5, "positive"},
        Case{"num_key_value_heads", 3, "divide"}, Case{"num_attention_heads", "4", "integer"},
        Case{"intermediate_size", 1.5, "integer"}, Case{"num_hidden_layers", 1e12, "integer"},
        Case{"max_position_embeddings", 4294967296, "out of range"},
        Case{"rms_norm_eps", 0, "(0, 1)"}, Case{"rope_theta", -1, "positive"},
        Case{"tie_word_embeddings", "yes", "true or false"},
        Case{"eos_token_id", 151936, "outside the vocabulary"},
        Case{"torch_dtype", "int8", "unknown dtype"}}) {
    Result<ModelConfig> config = load_edited([&](nlohmann::json& j) { j[c.key] = c.value; });
    expect_error_mentions(config.status(), {path(), std::string("'") + c.key + "'", c.says});
  }
  expect_error_mentions(load_edited([](nlohmann::json& c) { c.erase("hidden_size"); }).status(),
                        {path(), "'hidden_size'", "missing"});
}

TEST_F(ConfigEdits, MissingOrMalformedFile) {
  Result<ModelConfig> missing = load_model_config(dir_ / "absent.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  expect_error_mentions(missing.status(), {"absent.json"});
  testing::write_bytes(dir_ / "config.json", "{\"vocab_size\": 12,");
  expect_error_mentions(load_model_config(dir_ / "config.json").status(), {path(), "malformed"});
  testing::write_bytes(dir_ / "config.json", "[1, 2]");
  expect_error_mentions(load_model_config(dir_ / "config.json").status(), {path(), "object"});
}

TEST(GenerationConfig, ParsesQwen3Defaults) {
  Result<GenerationConfig> config =
      load_generation_config(kAssets / "qwen3-0.6b" / "generation_config.json");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_FLOAT_EQ(config->temperature.value(), 0.6f);
  EXPECT_FLOAT_EQ(config->top_p.value(), 0.95f);
  EXPECT_EQ(config->top_k, 20);
  EXPECT_EQ(config->do_sample, true);
  EXPECT_EQ(config->bos_token_id, 151643);
  EXPECT_EQ(config->pad_token_id, 151643);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int>{151645, 151643}));
}

TEST(GenerationConfig, MissingFileGivesDefaults) {
  TempDir dir;
  Result<GenerationConfig> config = load_generation_config(dir / "generation_config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(config->temperature || config->top_p || config->top_k || config->do_sample);
  EXPECT_TRUE(config->eos_token_ids.empty());
}

TEST(GenerationConfig, SingleEosAndNulls) {
  Result<GenerationConfig> config = parse_generation_config(
      {{"eos_token_id", 7}, {"temperature", nullptr}, {"top_k", 0}}, "inline");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->eos_token_ids, std::vector<int>{7});
  EXPECT_FALSE(config->temperature.has_value());
  EXPECT_EQ(config->top_k, 0);
}

TEST(GenerationConfig, MalformedIsAnErrorNamingFileAndKey) {
  TempDir dir;
  const std::filesystem::path path = dir / "generation_config.json";
  struct Case {
    const char* key;
    nlohmann::json value;
  };
  for (const Case& c : {Case{"temperature", -0.5}, Case{"temperature", "hot"}, Case{"top_p", 0.0},
                        Case{"top_p", 1.5}, Case{"top_k", -1}, Case{"do_sample", 1},
                        Case{"eos_token_id", {1, "x"}}, Case{"eos_token_id", -3}}) {
    write_json(path, {{c.key, c.value}});
    expect_error_mentions(load_generation_config(path).status(), {path.string(), c.key});
  }
  testing::write_bytes(path, "{\"top_k\": ");
  expect_error_mentions(load_generation_config(path).status(), {path.string(), "malformed"});
}

}  // namespace
}  // namespace pdserve
