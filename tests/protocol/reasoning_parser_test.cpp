#include "common/protocol/reasoning_parser.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

struct Streamed {
  std::string reasoning;
  std::string content;
  bool has_reasoning = false;
};

Streamed stream(const std::vector<std::string>& pieces, bool starts_in_reasoning) {
  ReasoningParser parser(starts_in_reasoning);
  Streamed out;
  for (const std::string& piece : pieces) {
    ReasoningDelta delta = parser.push(piece);
    out.reasoning += delta.reasoning;
    out.content += delta.content;
  }
  ReasoningDelta last = parser.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  out.has_reasoning = parser.has_reasoning();
  return out;
}

TEST(ReasoningParser, SplitsAQwen3ThinkingAnswer) {
  ReasoningSplit split =
      split_reasoning("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!", false);
  ASSERT_TRUE(split.reasoning);
  EXPECT_EQ(*split.reasoning, "The user greets me.\nI greet back.");
  EXPECT_EQ(split.content, "Hello!");
}

TEST(ReasoningParser, OutputWithoutThinkIsAllContentUnchanged) {
  ReasoningSplit split = split_reasoning("\n\nHello </think> there", false);
  EXPECT_FALSE(split.reasoning);
  EXPECT_EQ(split.content, "\n\nHello </think> there");
  // "<think>" that does not open the output is plain text.
  EXPECT_EQ(split_reasoning("Say <think>", false).content, "Say <think>");
  // A partial tag at the end of a short output is content.
  EXPECT_EQ(split_reasoning("<thi", false).content, "<thi");
}

TEST(ReasoningParser, PromptEndingInsideThinkMakesTheOutputReasoningUntilTheEndTag) {
  ReasoningSplit split = split_reasoning("step 1\nstep 2\n</think>\n\nAnswer: 4", true);
  EXPECT_EQ(*split.reasoning, "step 1\nstep 2");
  EXPECT_EQ(split.content, "Answer: 4");
}

TEST(ReasoningParser, WithoutAnEndTagEverythingIsReasoning) {
  ReasoningSplit split = split_reasoning("<think>\nstill thinking when max_tokens hit\n", false);
  EXPECT_EQ(*split.reasoning, "still thinking when max_tokens hit\n");
  EXPECT_EQ(split.content, "");
}

TEST(ReasoningParser, EmptyThinkBlock) {
  ReasoningSplit split = split_reasoning("<think>\n\n</think>\n\nHi", false);
  EXPECT_EQ(*split.reasoning, "");
  EXPECT_EQ(split.content, "Hi");
  // A second think block is content.
  EXPECT_EQ(split_reasoning("<think>a</think>b<think>c</think>", false).content,
            "b<think>c</think>");
}

TEST(ReasoningParser, PromptEndsInReasoning) {
  EXPECT_FALSE(prompt_ends_in_reasoning("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_ends_in_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_ends_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(prompt_ends_in_reasoning("<think>a</think> ... <think>"));
}

TEST(ReasoningParser, StreamingHoldsBackOnlyPartialTagsAndNewlines) {
  ReasoningParser parser(false);
  ReasoningDelta delta = parser.push("<thi");
  EXPECT_EQ(delta.reasoning, "");
  EXPECT_EQ(delta.content, "");
  delta = parser.push("nk>\nI think");
  EXPECT_TRUE(parser.has_reasoning());
  EXPECT_EQ(delta.reasoning, "I think");
  delta = parser.push(" so\n\n</th");
  EXPECT_EQ(delta.reasoning, " so");
  delta = parser.push("ink>\n\nYes");
  EXPECT_EQ(delta.reasoning, "");
  EXPECT_EQ(delta.content, "Yes");
  delta = parser.push(" </think>\n");
  EXPECT_EQ(delta.content, " </think>\n");
  delta = parser.finish();
  EXPECT_EQ(delta.reasoning + delta.content, "");
}

TEST(ReasoningParser, StreamingContentOnlyPassesThroughAtOnce) {
  ReasoningParser parser(false);
  EXPECT_EQ(parser.push("Hello").content, "Hello");
  EXPECT_FALSE(parser.has_reasoning());
  EXPECT_EQ(parser.push("\n</think>").content, "\n</think>");
}

// Property: for random outputs built from tag fragments, newlines and text, cut into random
// byte pieces, the concatenated deltas equal the whole-text split in both modes.
TEST(ReasoningParser, IncrementalEqualsWholeTextOnRandomSplits) {
  std::mt19937 rng(99);
  const std::vector<std::string> parts = {"<think>", "</think>", "\n",    "\n\n", "a", "é",  "<",
                                          "</",      "think>",   "</thi", "<th",  " ", "x y"};
  for (int round = 0; round < 20000; ++round) {
    std::string text;
    size_t count = rng() % 12;
    if (rng() % 2 == 0) text = "<think>";
    for (size_t i = 0; i < count; ++i) text += parts[rng() % parts.size()];
    std::vector<std::string> pieces;
    size_t begin = 0;
    while (begin < text.size()) {
      size_t length = 1 + rng() % 6;
      pieces.push_back(text.substr(begin, length));
      begin += length;
    }
    if (rng() % 4 == 0) pieces.push_back("");
    for (bool starts_in_reasoning : {false, true}) {
      ReasoningSplit whole = split_reasoning(text, starts_in_reasoning);
      Streamed streamed = stream(pieces, starts_in_reasoning);
      ASSERT_EQ(streamed.reasoning, whole.reasoning.value_or(""))
          << "round " << round << " text [" << text << "] mode " << starts_in_reasoning;
      ASSERT_EQ(streamed.content, whole.content)
          << "round " << round << " text [" << text << "] mode " << starts_in_reasoning;
      ASSERT_EQ(streamed.has_reasoning, whole.reasoning.has_value()) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace pdserve
