// The grammar constraint against the Qwen3 vocabulary: random logits, masked, sampled and
// accepted token by token, always give a sentence of the grammar, and EOS is refused until the
// grammar is complete.
#include "common/grammar/constraint.h"

#include <cmath>
#include <filesystem>
#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/sampling/sampler.h"

namespace pdserve {
namespace {

constexpr int32_t kEos = 151645;  // <|im_end|>
constexpr int kVocab = 151936;    // Qwen3's logits rows: the tokenizer's ids and padding

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

const ConstraintCompiler& compiler() {
  static const ConstraintCompiler instance(qwen3_tokenizer(), kVocab, {kEos});
  return instance;
}

bool bit(const std::vector<int32_t>& mask, int32_t token) {
  return ((static_cast<uint32_t>(mask[static_cast<size_t>(token) / 32]) >> (token % 32)) & 1u) != 0;
}

struct Generated {
  std::string text;
  bool ended = false;  // EOS sampled
};

// Samples from random logits under the constraint until EOS or `max_tokens`, checking at each
// step that the sampled token was allowed and that EOS was only allowed once complete.
Generated generate(const ConstraintHandle& constraint, uint64_t seed, int max_tokens = 400) {
  ConstraintMatcher matcher(constraint);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Sampler sampler;
  SamplerRng sampler_rng(seed);
  SamplingParams params;
  params.max_tokens = max_tokens;
  std::vector<float> logits(kVocab);
  std::vector<int32_t> tokens;
  std::vector<int32_t> allowed;
  Generated out;
  for (int step = 0; step < max_tokens; ++step) {
    for (float& logit : logits) logit = normal(rng);
    EXPECT_TRUE(matcher.allowed(allowed).ok());
    EXPECT_EQ(bit(allowed, kEos), matcher.complete()) << "step " << step;
    EXPECT_TRUE(matcher.mask(logits).ok());
    if (!matcher.complete()) {
      EXPECT_EQ(logits[kEos], -std::numeric_limits<float>::infinity());
    }
    const Result<SampleResult> sampled = sampler.sample(logits, params, {}, tokens, sampler_rng);
    EXPECT_TRUE(sampled.ok()) << sampled.status().to_string();
    if (!sampled.ok()) break;
    EXPECT_TRUE(bit(allowed, sampled->token)) << "token " << sampled->token;
    EXPECT_TRUE(matcher.accept(sampled->token).ok());
    if (sampled->token == kEos) {
      out.ended = true;
      break;
    }
    tokens.push_back(sampled->token);
  }
  out.text = qwen3_tokenizer().decode(tokens).value();
  return out;
}

ConstraintHandle compile(StructuredOutput::Kind kind, std::string spec) {
  Result<ConstraintHandle> compiled = compiler().compile({kind, std::move(spec)});
  EXPECT_TRUE(compiled.ok()) << compiled.status().to_string();
  return compiled.ok() ? *compiled : nullptr;
}

TEST(ConstraintTest, JsonSchemaOutputsParseValidateAndFinish) {
  const ConstraintHandle constraint = compile(StructuredOutput::Kind::kJsonSchema, R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": false})");
  ASSERT_NE(constraint, nullptr);
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const Generated out = generate(constraint, seed);
    ASSERT_TRUE(out.ended) << out.text;
    const nlohmann::ordered_json value = nlohmann::ordered_json::parse(out.text);
    ASSERT_EQ(value.size(), 4u) << out.text;
    EXPECT_TRUE(value.at("name").is_string());
    EXPECT_LE(value.at("name").get<std::string>().size(), 8u * 4);
    EXPECT_TRUE(value.at("age").is_number_integer());
    EXPECT_GE(value.at("age").get<int>(), 0);
    EXPECT_LE(value.at("age").get<int>(), 150);
    EXPECT_LE(value.at("tags").size(), 3u);
    for (const auto& tag : value.at("tags")) EXPECT_TRUE(tag == "red" || tag == "green");
    EXPECT_TRUE(value.at("ok").is_boolean());
    // Compact: no line breaks, no space that is not part of a separator.
    EXPECT_EQ(out.text.find('\n'), std::string::npos) << out.text;
    EXPECT_EQ(out.text.find("{ "), std::string::npos) << out.text;
  }
}

TEST(ConstraintTest, JsonObjectGivesAnObject) {
  const ConstraintHandle constraint =
      compile(StructuredOutput::Kind::kJsonSchema, R"({"type": "object"})");
  ASSERT_NE(constraint, nullptr);
  int ended = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    // Strings are unbounded: the output may be cut by max_tokens, but it is an object so far.
    const Generated out = generate(constraint, seed, 40);
    ASSERT_EQ(out.text.front(), '{');
    if (!out.ended) continue;
    ++ended;
    EXPECT_TRUE(nlohmann::json::parse(out.text).is_object()) << out.text;
  }
  EXPECT_GT(ended, 0);
}

TEST(ConstraintTest, ToolCallsFollowTheHermesFormat) {
  const ConstraintHandle constraint = compile(StructuredOutput::Kind::kToolCalls, R"({
    "tools": [
      {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 6}}, "required": ["city"]}},
      {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}}
    ],
    "multiple": true})");
  ASSERT_NE(constraint, nullptr);
  const std::regex call("<tool_call>\n(\\{.*?\\})\n</tool_call>");
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const Generated out = generate(constraint, seed, 300);
    if (!out.ended) continue;  // several calls, cut by max_tokens
    std::string rest = out.text;
    int calls = 0;
    for (std::smatch match; std::regex_search(rest, match, call); rest = match.suffix()) {
      ASSERT_EQ(match.position(0), calls == 0 ? 0 : 1) << out.text;  // "\n" between calls
      const nlohmann::ordered_json value = nlohmann::ordered_json::parse(match[1].str());
      ASSERT_EQ(value.begin().key(), "name");
      if (value.at("name") == "get_weather") {
        EXPECT_LE(value.at("arguments").at("city").get<std::string>().size(), 6u * 4);
      } else {
        ASSERT_EQ(value.at("name"), "add") << out.text;
        EXPECT_LE(value.at("arguments").at("a").get<int>(), 9);
      }
      ++calls;
    }
    EXPECT_GE(calls, 1);
    EXPECT_TRUE(rest.empty()) << out.text;
  }
}

TEST(ConstraintTest, ChoiceRefusesEosUntilComplete) {
  const ConstraintHandle constraint =
      compile(StructuredOutput::Kind::kGrammar, R"(root ::= "yes" | "no way")");
  ASSERT_NE(constraint, nullptr);
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const Generated out = generate(constraint, seed);
    ASSERT_TRUE(out.ended);
    EXPECT_TRUE(out.text == "yes" || out.text == "no way") << out.text;
  }
}

TEST(ConstraintTest, RegexOutputsFullmatch) {
  const ConstraintHandle constraint =
      compile(StructuredOutput::Kind::kRegex, R"([a-c]{2,5}-\d{3})");
  ASSERT_NE(constraint, nullptr);
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const Generated out = generate(constraint, seed);
    ASSERT_TRUE(out.ended);
    EXPECT_TRUE(std::regex_match(out.text, std::regex(R"([a-c]{2,5}-\d{3})"))) << out.text;
  }
}

TEST(ConstraintTest, AForbiddenTokenIsRefusedAndLeavesTheStateAlone) {
  const ConstraintHandle constraint =
      compile(StructuredOutput::Kind::kGrammar, R"(root ::= "yes")");
  ASSERT_NE(constraint, nullptr);
  ConstraintMatcher matcher(constraint);
  const int32_t no = qwen3_tokenizer().encode("no").value().at(0);
  EXPECT_EQ(matcher.accept(no).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(matcher.accept(kEos).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> yes = qwen3_tokenizer().encode("yes").value();
  for (const int32_t token : yes) {
    ASSERT_TRUE(matcher.accept(token).ok());
  }
  EXPECT_TRUE(matcher.complete());
  EXPECT_TRUE(matcher.accept(kEos).ok());
}

TEST(ConstraintTest, MalformedInputIsInvalidArgument) {
  const std::vector<StructuredOutput> bad = {
      {StructuredOutput::Kind::kJsonSchema, "not json"},
      {StructuredOutput::Kind::kJsonSchema, R"({"type": "no such type"})"},
      {StructuredOutput::Kind::kRegex, "(unbalanced"},
      {StructuredOutput::Kind::kGrammar, "root ::= undefined_rule"},
      {StructuredOutput::Kind::kToolCalls, R"({"tools": []})"},
  };
  for (const StructuredOutput& output : bad) {
    EXPECT_EQ(check_structured_output(output).code(), StatusCode::kInvalidArgument) << output.spec;
    EXPECT_EQ(compiler().compile(output).status().code(), StatusCode::kInvalidArgument)
        << output.spec;
  }
}

// The batched mask is the row-by-row mask: eight matchers at different points of two grammars,
// walked forward on random logits; each row's batch-masked logits equal what that matcher's own
// mask() gives. A matcher that accepted EOS and a row of the wrong size fail alone.
TEST(ConstraintTest, TheBatchedMaskEqualsEachRowsOwnMask) {
  const ConstraintHandle json = compile(StructuredOutput::Kind::kJsonSchema,
                                        R"({"type": "object", "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "string"}},
                                          "required": ["a", "b"]})");
  const ConstraintHandle digits = compile(StructuredOutput::Kind::kRegex, "[0-9]{1,40}");
  ASSERT_NE(json, nullptr);
  ASSERT_NE(digits, nullptr);
  constexpr size_t kRows = 8;
  std::vector<ConstraintMatcher> matchers;
  for (size_t i = 0; i < kRows; ++i) matchers.emplace_back(i % 2 == 0 ? json : digits);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  ConstraintBatchMasker masker;
  for (int step = 0; step < 12; ++step) {
    std::vector<std::vector<float>> batch_logits(kRows, std::vector<float>(kVocab));
    for (auto& row : batch_logits) {
      for (float& logit : row) logit = normal(rng);
    }
    std::vector<std::vector<float>> own_logits = batch_logits;
    std::vector<ConstraintMatcher*> pointers;
    std::vector<std::span<float>> rows;
    for (size_t i = 0; i < kRows; ++i) {
      pointers.push_back(&matchers[i]);
      rows.emplace_back(batch_logits[i]);
    }
    const std::vector<Status> statuses = masker.mask(pointers, rows);
    ASSERT_EQ(statuses.size(), kRows);
    for (size_t i = 0; i < kRows; ++i) {
      ASSERT_TRUE(statuses[i].ok()) << statuses[i].to_string();
      ASSERT_TRUE(matchers[i].mask(own_logits[i]).ok());
      ASSERT_EQ(batch_logits[i], own_logits[i]) << "row " << i << ", step " << step;
      // Row i moves on by its (i % 3)-th best allowed token, so the rows drift apart.
      std::vector<int32_t> order(kVocab);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 3, order.end(), [&](int32_t x, int32_t y) {
        return own_logits[i][static_cast<size_t>(x)] > own_logits[i][static_cast<size_t>(y)];
      });
      int32_t next = order[i % 3];
      if (std::isinf(own_logits[i][static_cast<size_t>(next)]) || next == kEos) next = order[0];
      if (next != kEos) {
        ASSERT_TRUE(matchers[i].accept(next).ok());
      }
    }
  }

  const int32_t seven = qwen3_tokenizer().encode("7").value().at(0);
  const int32_t letter = qwen3_tokenizer().encode("a").value().at(0);
  ConstraintMatcher ended(digits);
  ASSERT_TRUE(ended.accept(seven).ok());
  ASSERT_TRUE(ended.accept(kEos).ok());
  ConstraintMatcher fresh(digits);
  std::vector<float> ended_row(kVocab, 0.0f);
  std::vector<float> short_row(kVocab - 1, 0.0f);
  std::vector<float> good_row(kVocab, 0.0f);
  ConstraintMatcher short_matcher(digits);
  std::vector<ConstraintMatcher*> pointers{&ended, &short_matcher, &fresh};
  std::vector<std::span<float>> rows{ended_row, short_row, good_row};
  const std::vector<Status> statuses = masker.mask(pointers, rows);
  EXPECT_EQ(statuses[0].code(), StatusCode::kFailedPrecondition) << statuses[0].to_string();
  EXPECT_EQ(statuses[1].code(), StatusCode::kInvalidArgument) << statuses[1].to_string();
  EXPECT_TRUE(statuses[2].ok()) << statuses[2].to_string();
  EXPECT_EQ(good_row[static_cast<size_t>(seven)], 0.0f);
  EXPECT_EQ(good_row[kEos], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(good_row[static_cast<size_t>(letter)], -std::numeric_limits<float>::infinity());
}

// The batched bitmasks (for a device sampler) are each row's own allowed(), and applying one
// to a row is what mask() does to it.
TEST(ConstraintTest, TheBatchedBitmasksEqualEachRowsOwnAndApplyAsMaskDoes) {
  const ConstraintHandle json = compile(StructuredOutput::Kind::kJsonSchema,
                                        R"({"type": "object", "properties": {
                                          "a": {"type": "integer"}}, "required": ["a"]})");
  const ConstraintHandle digits = compile(StructuredOutput::Kind::kRegex, "[0-9]{1,40}");
  ASSERT_NE(json, nullptr);
  ASSERT_NE(digits, nullptr);
  const size_t words = token_bitmask_words(kVocab);
  std::vector<ConstraintMatcher> matchers;
  matchers.emplace_back(json);
  matchers.emplace_back(digits);
  ASSERT_TRUE(matchers[1].accept(qwen3_tokenizer().encode("4").value().at(0)).ok());
  ConstraintMatcher ended(digits);
  ASSERT_TRUE(ended.accept(qwen3_tokenizer().encode("7").value().at(0)).ok());
  ASSERT_TRUE(ended.accept(kEos).ok());
  std::vector<std::vector<int32_t>> bitmasks(3, std::vector<int32_t>(words, -1));
  std::vector<int32_t> short_mask(words - 1);
  std::vector<ConstraintMatcher*> pointers{&matchers[0], &matchers[1], &ended, &matchers[0]};
  std::vector<std::span<int32_t>> spans{bitmasks[0], bitmasks[1], bitmasks[2], short_mask};
  ConstraintBatchMasker masker;
  const std::vector<Status> statuses = masker.allowed(pointers, spans);
  ASSERT_EQ(statuses.size(), 4u);
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].to_string();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].to_string();
  EXPECT_EQ(statuses[2].code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(statuses[3].code(), StatusCode::kInvalidArgument);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t i = 0; i < 2; ++i) {
    std::vector<int32_t> own;
    ASSERT_TRUE(matchers[i].allowed(own).ok());
    EXPECT_EQ(bitmasks[i], own) << "row " << i;
    std::vector<float> masked(kVocab);
    for (float& logit : masked) logit = normal(rng);
    std::vector<float> applied = masked;
    ASSERT_TRUE(matchers[i].mask(masked).ok());
    apply_token_bitmask(bitmasks[i], applied);
    EXPECT_EQ(applied, masked) << "row " << i;
  }
  std::vector<float> untouched(kVocab, 1.0f);
  apply_token_bitmask({}, untouched);
  EXPECT_EQ(untouched, std::vector<float>(kVocab, 1.0f)) << "an empty mask masks nothing";
}

}  // namespace
}  // namespace pdserve
