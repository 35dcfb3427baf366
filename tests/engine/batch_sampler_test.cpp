// BatchSampler alone, on hand-made logits: one result per slot, nothing drawn for a slot
// without a sequence, a bad row failing only itself; on the device path, a row the device
// leaves to the host is drawn as the host path draws it, a device token's logprobs come from
// its logits row, and sample_step()'s error is the batch's. (Grammars: EngineCoreTest's and
// EngineCoreDeviceSampling's structured-output cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "common/engine/batch_sampler.h"
#include "engine_test_util.h"

namespace pdserve {
namespace {

using testing::kTestVocab;
using testing::make_sequence;

// A host executor that never runs (the test fills the logits itself), or a "device" one that
// returns the outcomes it is given.
class FixedExecutor : public ModelExecutor {
 public:
  explicit FixedExecutor(bool on_device) : on_device_(on_device) {}
  int vocab_size() const override { return kTestVocab; }
  Status execute(const ScheduledBatch&, std::span<float>, const LayerKvWritten&) override {
    return unimplemented("not used");
  }
  bool samples_on_device() const override { return on_device_; }
  Status sample_step(std::span<const std::span<const int32_t>>, std::span<SampledRow> results,
                     std::span<float> logits) override {
    if (!step_error.ok()) return step_error;
    for (size_t i = 0; i < results.size(); ++i) results[i] = outcomes[i];
    std::copy(raw_logits.begin(), raw_logits.end(), logits.begin());
    return Status::ok_status();
  }

  Status step_error;
  std::vector<SampledRow> outcomes;
  std::vector<float> raw_logits;  // what the device copies back

 private:
  bool on_device_;
};

// Row r: token 10 + r the clear maximum.
std::vector<float> peaked_logits(size_t rows) {
  std::vector<float> logits(rows * kTestVocab, 0.0f);
  for (size_t r = 0; r < rows; ++r) logits[r * kTestVocab + 10 + r] = 8.0f;
  return logits;
}

TEST(BatchSampler, EachSlotGetsItsOwnDrawAndABadRowFailsOnlyItself) {
  FixedExecutor executor(false);
  BatchSampler sampler(executor);
  Sequence a = make_sequence(1, {1, 2, 3});
  Sequence c = make_sequence(3, {1, 2, 3});
  SamplerRng rng_a(1), rng_c(3);
  const std::vector<SamplingSlot> slots = {{&a, &rng_a, nullptr}, {}, {&c, &rng_c, nullptr}};
  std::span<float> logits = sampler.logits(3);
  ASSERT_EQ(logits.size(), 3u * kTestVocab);
  const std::vector<float> peaked = peaked_logits(3);
  std::copy(peaked.begin(), peaked.end(), logits.begin());
  logits[2 * kTestVocab + 5] = std::numeric_limits<float>::quiet_NaN();

  const std::vector<SlotSample> results = sampler.sample(slots);
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[0].has_value() && results[0]->ok());
  EXPECT_EQ((*results[0])->token, 10);
  EXPECT_FALSE(results[1].has_value()) << "nothing is drawn for a slot without a sequence";
  ASSERT_TRUE(results[2].has_value());
  EXPECT_EQ(results[2]->status().code(), StatusCode::kInvalidArgument);
}

TEST(BatchSampler, TheDevicePathGivesWhatTheHostPathGives) {
  const Sequence plain = make_sequence(1, {1, 2, 3});
  SamplingParams with_logprobs = plain.sampling_params();
  with_logprobs.want_logprobs = true;
  with_logprobs.logprobs = 1;
  const Sequence a(1, {1, 2, 3}, with_logprobs, plain.stop_checker(), 1,
                   std::chrono::steady_clock::now());
  const Sequence b = make_sequence(2, {4, 5});
  const std::vector<float> peaked = peaked_logits(2);

  // The host path's results.
  FixedExecutor host(false);
  BatchSampler host_sampler(host);
  SamplerRng host_a(1), host_b(2);
  std::span<float> host_logits = host_sampler.logits(2);
  std::copy(peaked.begin(), peaked.end(), host_logits.begin());
  const std::vector<SlotSample> expected = host_sampler.sample(
      std::vector<SamplingSlot>{{&a, &host_a, nullptr}, {&b, &host_b, nullptr}});

  // The device samples row 0 itself and leaves row 1 to the host.
  FixedExecutor device(true);
  device.outcomes = {{SampleOutcome::kSampled, 10}, {SampleOutcome::kLeftToHost, 0}};
  device.raw_logits = peaked;
  BatchSampler device_sampler(device);
  SamplerRng device_a(1), device_b(2);
  const std::vector<SamplingSlot> slots = {{&a, &device_a, nullptr}, {&b, &device_b, nullptr}};
  device_sampler.logits(2);
  const std::span<const SamplingRow> rows = device_sampler.device_rows(slots);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].params, &a.sampling_params());
  EXPECT_EQ(rows[1].rng, &device_b);
  std::vector<SlotSample> results;
  ASSERT_TRUE(device_sampler.sample_on_device(slots, results).ok());
  ASSERT_EQ(results.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_TRUE(results[r].has_value() && results[r]->ok() && expected[r]->ok());
    EXPECT_EQ((*results[r])->token, (*expected[r])->token);
    EXPECT_FLOAT_EQ((*results[r])->logprob, (*expected[r])->logprob);
    EXPECT_EQ((*results[r])->top_logprobs.size(), (*expected[r])->top_logprobs.size());
  }
  EXPECT_EQ((*results[0])->top_logprobs.size(), 1u);

  device.step_error = internal_error("device lost");
  EXPECT_EQ(device_sampler.sample_on_device(slots, results).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace pdserve
