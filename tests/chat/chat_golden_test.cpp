// Byte-identical rendering against the goldens of tools/oracle/gen_chat_golden.py: conversations
// rendered by transformers' apply_chat_template, interpreter-feature cases by @huggingface/jinja.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"

namespace pdserve {
namespace {

std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<nlohmann::ordered_json> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::ordered_json::parse(line));
  }
  return lines;
}

const std::string kDataDir = std::string(PDSERVE_TEST_DATA_DIR) + "/chat/";

TEST(ChatGolden, Qwen3TemplateMatchesReferenceOnEveryConversation) {
  auto tmpl = ChatTemplate::from_tokenizer_config(std::string(PDSERVE_ASSETS_DIR) +
                                                  "/qwen3-tokenizer/tokenizer_config.json");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto cases = read_jsonl(kDataDir + "qwen3_golden.jsonl");
  ASSERT_GE(cases.size(), 40u);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto rendered = tmpl->render(cases[i]["context"]);
    ASSERT_TRUE(rendered.ok()) << "case " << i << ": " << rendered.status().to_string();
    EXPECT_EQ(*rendered, cases[i]["rendered"].get<std::string>()) << "case " << i;
  }
}

TEST(ChatGolden, FeatureTemplatesMatchReference) {
  auto cases = read_jsonl(kDataDir + "templates_golden.jsonl");
  ASSERT_GE(cases.size(), 50u);
  size_t rendered_cases = 0;
  size_t error_cases = 0;
  for (const auto& test_case : cases) {
    const std::string name = test_case["name"].get<std::string>();
    auto tmpl = ChatTemplate::parse(test_case["template"].get<std::string>());
    if (test_case.contains("error")) {
      ++error_cases;
      // The reference refused to render; so must we (at parse or at render time).
      if (tmpl.ok()) {
        auto rendered = tmpl->render(test_case["context"]);
        EXPECT_FALSE(rendered.ok()) << name << " rendered: " << *rendered;
      }
      continue;
    }
    ++rendered_cases;
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().to_string();
    auto rendered = tmpl->render(test_case["context"]);
    ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status().to_string();
    EXPECT_EQ(*rendered, test_case["rendered"].get<std::string>()) << name;
  }
  EXPECT_GE(rendered_cases, 40u);
  EXPECT_GE(error_cases, 10u);
}

}  // namespace
}  // namespace pdserve
