// OutputProcessor alone: the deltas of a token stream with stop strings, delta by delta. The
// token ids are Qwen3's for "The quick brown fox jumps over the lazy dog, again and again."
// (Hugging Face tokenizers' encode), and every expected text was worked out by hand with
// Python's str semantics: the answer is text[:text.find(stop)] (+ the stop with
// include_stop_str_in_output) for the stop string whose match ends first, and a delta holds
// back the longest tail that could still begin a stop string.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/engine/output_processor.h"

namespace pdserve {
namespace {

constexpr int kVocab = 151936;
constexpr int32_t kImEnd = 151645;
// 'The', ' quick', ' brown', ' fox', ' jumps', ' over', ' the', ' lazy', ' dog', ',', ' again',
// ' and', ' again', '.'
const std::vector<int32_t> kFox = {785,   3974, 13876, 38835, 34208, 916,  279,
                                   15678, 5562, 11,    1549,  323,   1549, 13};

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

InferenceRequest request(std::vector<std::string> stop, bool include = false) {
  InferenceRequest r;
  r.id = "r";
  r.prompt_tokens = {1, 2, 3};
  r.sampling.max_tokens = static_cast<int>(kFox.size());
  r.stop = std::move(stop);
  r.include_stop_str_in_output = include;
  return r;
}

class OutputProcessorTest : public ::testing::Test {
 protected:
  // Feeds `tokens`, the last one with `last_reason`, until a delta finishes.
  std::vector<SequenceDelta> run(RequestOutput& output, const std::vector<int32_t>& tokens,
                                 FinishReason last_reason = FinishReason::kLength) {
    std::vector<SequenceDelta> deltas;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const FinishReason reason = i + 1 == tokens.size() ? last_reason : FinishReason::kNone;
      deltas.push_back(processor_.token_delta(output, SequenceUpdate{1, tokens[i], reason}));
      EXPECT_EQ(deltas.back().token_ids, std::vector<int32_t>{tokens[i]});
      if (deltas.back().finished) break;
    }
    return deltas;
  }

  static std::vector<std::string> texts(const std::vector<SequenceDelta>& deltas) {
    std::vector<std::string> out;
    for (const SequenceDelta& d : deltas) out.push_back(d.text);
    return out;
  }

  OutputProcessor processor_{tokenizer(), {kImEnd}, kVocab};
};

TEST_F(OutputProcessorTest, AStopStringAcrossTokensEndsTheStreamWithoutLeakingIt) {
  // find("fox j") = 16.
  RequestOutput output(tokenizer(), request({"fox j"}));
  const std::vector<SequenceDelta> deltas = run(output, kFox);
  EXPECT_EQ(texts(deltas), (std::vector<std::string>{"The", " quick", " brown", " ", ""}));
  ASSERT_TRUE(deltas.back().finished);
  EXPECT_EQ(deltas.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(deltas.back().matched_stop, "fox j");
  EXPECT_EQ(deltas.back().completion_tokens, 5);

  RequestOutput included(tokenizer(), request({"fox j"}, /*include=*/true));
  EXPECT_EQ(texts(run(included, kFox)),
            (std::vector<std::string>{"The", " quick", " brown", " ", "fox j"}));
}

TEST_F(OutputProcessorTest, AHeldBackTailIsReleasedByTheTextThatSettlesIt) {
  // "lazy" could begin "lazy cat" until " dog" comes; find("lazy cat") = -1.
  RequestOutput output(tokenizer(), request({"lazy cat"}));
  const std::vector<SequenceDelta> deltas = run(output, kFox);
  EXPECT_EQ(texts(deltas),
            (std::vector<std::string>{"The", " quick", " brown", " fox", " jumps", " over", " the",
                                      " ", "lazy dog", ",", " again", " and", " again", "."}));
  EXPECT_EQ(deltas.back().finish_reason, FinishReason::kLength);
  EXPECT_EQ(deltas.back().matched_stop, "");
}

TEST_F(OutputProcessorTest, ATailHeldAtTheEndComesWithTheFinalDelta) {
  // "again." could begin "again. The end" when the stream ends.
  RequestOutput output(tokenizer(), request({"again. The end"}));
  const std::vector<SequenceDelta> deltas = run(output, kFox);
  EXPECT_EQ(texts(deltas),
            (std::vector<std::string>{"The", " quick", " brown", " fox", " jumps", " over", " the",
                                      " lazy", " dog", ",", " ", "again and", " ", "again."}));
  EXPECT_EQ(deltas.back().finish_reason, FinishReason::kLength);
}

TEST_F(OutputProcessorTest, TheStopStringThatCompletesFirstWins) {
  // "over the lazy" ends at 39, "dog" at 43: text[:26].
  RequestOutput output(tokenizer(), request({"dog", "over the lazy"}));
  const std::vector<SequenceDelta> deltas = run(output, kFox);
  EXPECT_EQ(texts(deltas),
            (std::vector<std::string>{"The", " quick", " brown", " fox", " jumps", " ", "", ""}));
  EXPECT_EQ(deltas.back().matched_stop, "over the lazy");
}

TEST_F(OutputProcessorTest, AnEosReleasesTheHeldTailAndShowsNoTextOfItsOwn) {
  RequestOutput output(tokenizer(), request({"lazy cat"}));
  std::vector<int32_t> tokens(kFox.begin(), kFox.begin() + 8);  // ... ' the', ' lazy'
  tokens.push_back(kImEnd);
  const std::vector<SequenceDelta> deltas = run(output, tokens, FinishReason::kStop);
  EXPECT_EQ(texts(deltas), (std::vector<std::string>{"The", " quick", " brown", " fox", " jumps",
                                                     " over", " the", " ", "lazy"}));
  EXPECT_EQ(deltas.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(deltas.back().matched_stop, "");
}

TEST_F(OutputProcessorTest, AResumedStreamGoesOnWhereTheClientsTextEnds) {
  const InferenceRequest r = request({"fox jumps over the lazy cat"});
  RequestOutput output(tokenizer(), r);
  const std::vector<int32_t> delivered(kFox.begin(), kFox.begin() + 4);  // ... ' fox'
  ASSERT_TRUE(processor_.catch_up(output, delivered).ok());
  const std::vector<int32_t> rest(kFox.begin() + 4, kFox.begin() + 9);  // ' jumps' ... ' dog'
  const std::vector<SequenceDelta> deltas = run(output, rest);
  ASSERT_EQ(deltas.size(), 5u);
  // "fox" was held back when the first node stopped: the client has "The quick brown ".
  EXPECT_EQ(deltas[0].resumed_text, "The quick brown ");
  for (size_t i = 1; i < deltas.size(); ++i) EXPECT_FALSE(deltas[i].resumed_text.has_value());
  EXPECT_EQ(texts(deltas),
            (std::vector<std::string>{"", "", "", "", "fox jumps over the lazy dog"}));
  EXPECT_EQ(deltas.back().completion_tokens, 9);

  RequestOutput stopped(tokenizer(), request({"quick"}));
  const Status refused = processor_.catch_up(stopped, std::vector<int32_t>{785, 3974});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("already contains a stop string"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
