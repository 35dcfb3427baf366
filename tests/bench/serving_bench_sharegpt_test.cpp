// pdserve-bench-serving on vLLM's ShareGPT JSON: parsing, vLLM's length filter and sampling
// (against Hugging Face tokenizers' counts), seeded shuffles, malformed files.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/serving/sharegpt_dataset.h"
#include "bench/serving/workload.h"
#include "common/core/files.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/bench/serving_bench_fixtures.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;

// ---- vLLM's ShareGPT dataset -------------------------------------------------------------------
std::vector<ShareGptConversation> fixture_conversations() {
  const Result<std::string> text = read_text_file(kShareGptFixture);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  Result<std::vector<ShareGptConversation>> conversations =
      parse_sharegpt(text.ok() ? *text : "[]", kShareGptFixture.string());
  EXPECT_TRUE(conversations.ok()) << conversations.status().to_string();
  return conversations.ok() ? *conversations : std::vector<ShareGptConversation>{};
}

Tokenizer qwen3_tokenizer() {
  return Tokenizer::from_model_dir(kQwen3Tokenizer).value();
}

// Token counts of the fixture's first two turns by Hugging Face tokenizers 0.23.3 on

TEST(ShareGpt, ParseKeepsEveryConversationWithTwoTurnsInFileOrder) {
  const std::vector<ShareGptConversation> conversations = fixture_conversations();
  // 10 entries; the one with a single turn and the one without "conversations" are skipped.
  ASSERT_EQ(conversations.size(), std::size(kFixtureCounts));
  for (size_t i = 0; i < conversations.size(); ++i) {
    EXPECT_TRUE(conversations[i].prompt.starts_with(kFixtureCounts[i].prompt_start))
        << conversations[i].prompt;
  }
  EXPECT_TRUE(conversations[3].reply.starts_with("Usually the starter")) << conversations[3].reply;
  EXPECT_EQ(conversations[7].reply.substr(0, 13), "Right, I stil");
}

TEST(ShareGpt, LengthFilterMatchesVllmsBounds) {
  EXPECT_TRUE(passes_vllm_length_filter(4, 4, false));
  EXPECT_FALSE(passes_vllm_length_filter(3, 100, false));
  EXPECT_FALSE(passes_vllm_length_filter(100, 3, false));
  EXPECT_TRUE(passes_vllm_length_filter(100, 3, true));  // a fixed output length skips that check
  EXPECT_FALSE(passes_vllm_length_filter(3, 100, true));
  EXPECT_TRUE(passes_vllm_length_filter(1024, 1024, false));
  EXPECT_FALSE(passes_vllm_length_filter(1025, 4, false));
  EXPECT_FALSE(passes_vllm_length_filter(1000, 1049, false));
  EXPECT_TRUE(passes_vllm_length_filter(1000, 1048, false));
}

// The oracle: kFixtureCounts run through vLLM's rule, in file order (shuffle off).
std::vector<std::pair<std::string, int>> expected_survivors(std::optional<int> fixed_output) {
  std::vector<std::pair<std::string, int>> survivors;
  for (const FixtureConversation& c : kFixtureCounts) {
    const int output_len = fixed_output.value_or(c.reply_tokens);
    if (passes_vllm_length_filter(c.prompt_tokens, output_len, fixed_output.has_value())) {
      survivors.emplace_back(c.prompt_start, output_len);
    }
  }
  return survivors;
}

std::vector<std::pair<std::string, int>> sampled(const std::vector<BenchRequest>& requests,
                                                 const std::vector<ShareGptConversation>& all) {
  std::vector<std::pair<std::string, int>> out;
  for (const BenchRequest& request : requests) {
    EXPECT_TRUE(request.prompt.empty());  // sent as text, the server counts its tokens
    std::string start;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].prompt == request.prompt_text) start = kFixtureCounts[i].prompt_start;
    }
    out.emplace_back(start, request.output_len);
  }
  return out;
}

TEST(ShareGpt, SamplingKeepsWhatVllmKeepsWithTheReplysTokenCount) {
  const std::vector<ShareGptConversation> all = fixture_conversations();
  const Tokenizer tokenizer = qwen3_tokenizer();
  ShareGptSource source;
  source.shuffle = false;
  source.oversample = false;
  const Result<std::vector<BenchRequest>> natural = sample_sharegpt(all, tokenizer, source, 100, 0);
  ASSERT_TRUE(natural.ok()) << natural.status().to_string();
  EXPECT_EQ(expected_survivors(std::nullopt).size(), 4u);
  EXPECT_EQ(sampled(*natural, all), expected_survivors(std::nullopt));

  // --sharegpt-output-len: every request asks for it; short replies no longer drop a pair, long
  // ones no longer count towards the total.
  source.output_len = 8;
  const Result<std::vector<BenchRequest>> fixed = sample_sharegpt(all, tokenizer, source, 100, 0);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  EXPECT_EQ(expected_survivors(8).size(), 6u);
  EXPECT_EQ(sampled(*fixed, all), expected_survivors(8));

  // The first num_prompts that pass, in order.
  source.output_len.reset();
  const Result<std::vector<BenchRequest>> two = sample_sharegpt(all, tokenizer, source, 2, 0);
  ASSERT_TRUE(two.ok());
  const auto survivors = expected_survivors(std::nullopt);
  EXPECT_EQ(sampled(*two, all), decltype(survivors)(survivors.begin(), survivors.begin() + 2));
}

TEST(ShareGpt, ShuffleAndOversampleAreSeeded) {
  const std::vector<ShareGptConversation> all = fixture_conversations();
  const Tokenizer tokenizer = qwen3_tokenizer();
  auto survivors = expected_survivors(std::nullopt);
  std::sort(survivors.begin(), survivors.end());
  ShareGptSource source;
  std::set<std::vector<std::pair<std::string, int>>> orders;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const Result<std::vector<BenchRequest>> requests =
        sample_sharegpt(all, tokenizer, source, 10, seed);
    ASSERT_TRUE(requests.ok()) << requests.status().to_string();
    ASSERT_EQ(requests->size(), 10u);  // oversampled from the 4 that pass
    auto picked = sampled(*requests, all);
    // The first four are the survivors in a shuffled order, the rest repeats of them.
    std::vector<std::pair<std::string, int>> first(picked.begin(), picked.begin() + 4);
    orders.insert(first);
    std::sort(first.begin(), first.end());
    EXPECT_EQ(first, survivors) << seed;
    for (const auto& repeat : picked) {
      EXPECT_TRUE(std::binary_search(survivors.begin(), survivors.end(), repeat)) << repeat.first;
    }
    EXPECT_EQ(sampled(sample_sharegpt(all, tokenizer, source, 10, seed).value(), all), picked);
  }
  EXPECT_GT(orders.size(), 5u);  // 20 seeds over 24 orders: shuffled, not fixed

  source.oversample = false;
  EXPECT_EQ(sample_sharegpt(all, tokenizer, source, 10, 3).value().size(), 4u);
}

TEST(ShareGpt, MalformedFilesAreRefusedNamingTheEntry) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"[{\"conversations\": []}", "s.json: not a JSON document"},
      {"{\"conversations\": []}", "s.json: expected a JSON array"},
      {"[{\"conversations\": []}, 7]", "s.json: entry 1: not a JSON object"},
      {"[{\"conversations\": {\"from\": \"human\"}}]",
       "entry 0: \"conversations\" is not an array"},
      {"[{\"conversations\": [{\"from\": \"human\", \"value\": \"hello there\"}, {\"from\": "
       "\"gpt\"}]}]",
       "entry 0: conversations[1] has no string \"value\""},
      {"[{\"conversations\": [{\"value\": 3}, {\"value\": \"x\"}]}]",
       "entry 0: conversations[0] has no string \"value\""},
      {"[{\"conversations\": [\"hi\", \"there\"]}]", "conversations[0] is not a JSON object"},
  };
  for (const Case& c : cases) {
    const Result<std::vector<ShareGptConversation>> parsed = parse_sharegpt(c.text, "s.json");
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << parsed.status().message();
  }
  // Well-formed but nothing usable: vLLM would have nothing to send either.
  const Result<std::vector<ShareGptConversation>> too_short =
      parse_sharegpt("[{\"conversations\": [{\"value\": \"Hi\"}, {\"value\": \"Yo\"}]}]", "s.json");
  ASSERT_TRUE(too_short.ok());
  ShareGptSource source;
  source.path = "s.json";
  const Result<std::vector<BenchRequest>> none =
      sample_sharegpt(*too_short, qwen3_tokenizer(), source, 5, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no conversation passes"), std::string::npos);
}

TEST(ShareGpt, WorkloadReadsTheFileWithTheTokenizerAndAssignsArrivals) {
  WorkloadOptions options;
  options.sharegpt.path = kShareGptFixture.string();
  options.sharegpt.tokenizer_path = (kQwen3Tokenizer / "tokenizer.json").string();
  options.sharegpt.shuffle = false;
  options.num_prompts = 6;
  options.request_rate = 5;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  EXPECT_EQ(dataset_name(options), "sharegpt");
  ASSERT_EQ(requests->size(), 6u);
  EXPECT_EQ((*requests)[0].output_len, 38);
  EXPECT_EQ((*requests)[0].arrival_s, 0.0);
  EXPECT_GT((*requests)[5].arrival_s, (*requests)[4].arrival_s);

  options.sharegpt.tokenizer_path.clear();
  EXPECT_NE(make_workload(options).status().message().find("--tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::bench
