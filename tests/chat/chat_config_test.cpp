// Loading chat templates from tokenizer_config.json files, good and bad.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"

namespace pdserve {
namespace {

class ChatConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pdserve_chat_config_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& text) {
    auto path = dir_ / "tokenizer_config.json";
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(ChatConfigTest, ReadsTemplateAndSpecialTokens) {
  auto path = write(R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ messages|length }}",
                        "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})");
  auto tmpl = ChatTemplate::from_tokenizer_config(path);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto rendered = tmpl->render(nlohmann::json{{"messages", nlohmann::json::array({1, 2})}});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, "<s>|</s>|2");
  // Context values win over the config's tokens.
  rendered =
      tmpl->render(nlohmann::json{{"messages", nlohmann::json::array()}, {"eos_token", "E"}});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, "<s>|E|0");
}

TEST_F(ChatConfigTest, PicksDefaultFromTemplateList) {
  auto path = write(R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                                          {"name": "default", "template": "default {{ 1 + 1 }}"}]})");
  auto tmpl = ChatTemplate::from_tokenizer_config(path);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto rendered = tmpl->render(nlohmann::json::object());
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, "default 2");
}

TEST_F(ChatConfigTest, RejectsBadConfigs) {
  struct Case {
    const char* text;
    StatusCode code;
    const char* fragment;
  };
  const Case cases[] = {
      {R"({"bos_token": "<s>"})", StatusCode::kNotFound, "chat_template"},
      {R"({"chat_template": 42})", StatusCode::kInvalidArgument, "string or a list"},
      {R"({"chat_template": [{"name": "tool_use", "template": "x"}]})", StatusCode::kNotFound,
       "tool_use"},
      {R"({"chat_template": [{"template": "x"}]})", StatusCode::kInvalidArgument, "name"},
      {R"({"chat_template": "{% if %}"})", StatusCode::kInvalidArgument, "line 1:"},
      {R"({"chat_template": "x", "eos_token": 7})", StatusCode::kInvalidArgument, "eos_token"},
      {R"([1, 2])", StatusCode::kInvalidArgument, "not a JSON object"},
  };
  for (const Case& c : cases) {
    auto tmpl = ChatTemplate::from_tokenizer_config(write(c.text));
    ASSERT_FALSE(tmpl.ok()) << c.text;
    EXPECT_EQ(tmpl.status().code(), c.code) << tmpl.status().to_string();
    EXPECT_NE(tmpl.status().message().find(c.fragment), std::string::npos)
        << tmpl.status().to_string();
    EXPECT_NE(tmpl.status().message().find("tokenizer_config.json"), std::string::npos)
        << tmpl.status().to_string();
  }
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config(write("{not json")).ok());
  EXPECT_FALSE(ChatTemplate::from_tokenizer_config(dir_ / "missing.json").ok());
}

TEST_F(ChatConfigTest, VendoredQwen3ConfigLoads) {
  auto tmpl = ChatTemplate::from_tokenizer_config(std::string(PDSERVE_ASSETS_DIR) +
                                                  "/qwen3-tokenizer/tokenizer_config.json");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto rendered =
      tmpl->render(nlohmann::ordered_json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                          {"add_generation_prompt", true},
                                          {"enable_thinking", false}});
  ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
  EXPECT_EQ(*rendered,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace pdserve
