#include "common/sampling/sampler_rng.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdserve {
namespace {

// Published test vectors: splitmix64 started at 0 yields 0xe220a8397b1dcdaf,
// 0x6e789e6aa1b965f4, 0x06c45d188009454f; xoshiro256** from the state {1, 2, 3, 4} yields
// 11520, 0, 1509978240, 1215971899390074240 (the reference C code by Blackman and Vigna).
TEST(SamplerRng, SeedingMatchesSplitmix64) {
  SamplerRng rng(0);
  EXPECT_EQ(rng.state()[0], 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.state()[1], 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.state()[2], 0x06c45d188009454full);
}

TEST(SamplerRng, OutputsMatchXoshiro256StarStar) {
  Result<SamplerRng> rng = SamplerRng::from_state({1, 2, 3, 4});
  ASSERT_TRUE(rng.ok());
  EXPECT_EQ(rng->next_u64(), 11520u);
  EXPECT_EQ(rng->next_u64(), 0u);
  EXPECT_EQ(rng->next_u64(), 1509978240u);
  EXPECT_EQ(rng->next_u64(), 1215971899390074240u);
}

TEST(SamplerRng, AllZeroStateIsRejected) {
  EXPECT_EQ(SamplerRng::from_state({0, 0, 0, 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SamplerRng, SavedStateResumesTheSameStream) {
  SamplerRng rng(42);
  for (int i = 0; i < 10; ++i) rng.next_u64();
  Result<SamplerRng> resumed = SamplerRng::from_state(rng.state());
  ASSERT_TRUE(resumed.ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(resumed->next_u64(), rng.next_u64());
}

TEST(SamplerRng, UnitDrawsLieInHalfOpenIntervalWithTheRightMean) {
  SamplerRng rng(7);
  double sum = 0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    double u = rng.next_unit();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // The mean of n uniforms has standard deviation 1/sqrt(12 n) ~ 0.0009; allow 5 of them.
  EXPECT_NEAR(sum / kDraws, 0.5, 0.0046);
}

TEST(SamplerRng, ForRequestUsesTheSeedElseTheEntropy) {
  SamplingParams seeded;
  seeded.seed = 1234;
  EXPECT_EQ(SamplerRng::for_request(seeded, 99).state(), SamplerRng(1234).state());
  EXPECT_EQ(SamplerRng::for_request(SamplingParams{}, 99).state(), SamplerRng(99).state());
}

}  // namespace
}  // namespace pdserve
