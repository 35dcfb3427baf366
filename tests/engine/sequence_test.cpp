#include "common/engine/sequence.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine_test_util.h"

namespace pdserve {
namespace {

using testing::greedy_params;
using testing::kTestEos;
using testing::kTestVocab;

Sequence make_stopping_sequence(SamplingParams params) {
  const int32_t eos[] = {kTestEos};
  Result<StopChecker> stop = StopChecker::create(params, eos, kTestVocab);
  EXPECT_TRUE(stop.ok()) << stop.status().to_string();
  return Sequence(7, {5, 6, 7}, params, std::move(stop).value(), 3,
                  std::chrono::steady_clock::now());
}

std::vector<int32_t> as_vector(std::span<const int32_t> tokens) {
  return {tokens.begin(), tokens.end()};
}

TEST(SequenceTest, KeepsPromptAndOutputContiguous) {
  Sequence seq = make_stopping_sequence(greedy_params(3));
  EXPECT_EQ(seq.id(), 7);
  EXPECT_EQ(seq.arrival_order(), 3u);
  EXPECT_EQ(seq.status(), SequenceStatus::kWaiting);
  EXPECT_EQ(seq.num_uncomputed_tokens(), 3);
  EXPECT_TRUE(seq.is_prefilling());

  seq.set_num_computed_tokens(3);
  EXPECT_EQ(seq.append_output_token(9), FinishReason::kNone);
  EXPECT_EQ(as_vector(seq.tokens()), (std::vector<int32_t>{5, 6, 7, 9}));
  EXPECT_EQ(as_vector(seq.prompt_tokens()), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(as_vector(seq.output_tokens()), (std::vector<int32_t>{9}));
  EXPECT_EQ(seq.num_output_tokens(), 1);
  EXPECT_FALSE(seq.is_prefilling());  // only the sampled token lacks KV: decode phase

  // Recompute after preemption: the output is part of the context again.
  seq.set_num_computed_tokens(0);
  seq.set_status(SequenceStatus::kPreempted);
  EXPECT_TRUE(seq.is_prefilling());
  EXPECT_EQ(seq.num_uncomputed_tokens(), 4);
  EXPECT_EQ(sequence_status_name(seq.status()), "preempted");
}

TEST(SequenceTest, StopsAtMaxTokens) {
  Sequence seq = make_stopping_sequence(greedy_params(2));
  EXPECT_EQ(seq.append_output_token(kTestEos), FinishReason::kNone);  // ignore_eos
  EXPECT_EQ(seq.append_output_token(4), FinishReason::kLength);
  EXPECT_EQ(seq.status(), SequenceStatus::kFinished);
  EXPECT_TRUE(seq.is_done());
  EXPECT_EQ(seq.finish_reason(), FinishReason::kLength);
}

TEST(SequenceTest, StopsAtEosUnlessIgnored) {
  Sequence seq = make_stopping_sequence(greedy_params(8, /*ignore_eos=*/false));
  EXPECT_EQ(seq.append_output_token(3), FinishReason::kNone);
  EXPECT_FALSE(seq.is_done());
  EXPECT_EQ(seq.append_output_token(kTestEos), FinishReason::kStop);
  EXPECT_EQ(seq.status(), SequenceStatus::kFinished);
  EXPECT_EQ(seq.num_output_tokens(), 2);
}

}  // namespace
}  // namespace pdserve
