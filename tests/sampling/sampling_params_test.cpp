#include "common/sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace pdserve {
namespace {

constexpr int kVocab = 151936;

// Expects validate() to fail with InvalidArgument and a message naming `parameter`.
void expect_rejected(const std::function<void(SamplingParams&)>& edit,
                     const std::string& parameter) {
  SamplingParams params;
  edit(params);
  Status status = params.validate(kVocab);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << parameter;
  EXPECT_NE(status.message().find(parameter), std::string::npos) << status.message();
}

TEST(SamplingParams, DefaultsAndBoundaryValuesAreValid) {
  EXPECT_TRUE(SamplingParams().validate(kVocab).ok());
  SamplingParams edge;
  edge.temperature = 0.0f;
  edge.top_p = 1.0f;
  edge.top_k = -1;
  edge.min_p = 1.0f;
  edge.repetition_penalty = 0.01f;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.logprobs = 20;
  edge.max_tokens = 1;
  edge.min_tokens = 1;
  edge.stop_token_ids = {0, kVocab - 1};
  EXPECT_TRUE(edge.validate(kVocab).ok());
}

TEST(SamplingParams, RejectsEachOutOfRangeParameterByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  expect_rejected([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  expect_rejected([&](SamplingParams& p) { p.temperature = nan; }, "temperature");
  expect_rejected([&](SamplingParams& p) { p.temperature = inf; }, "temperature");
  expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.top_p = 1.01f; }, "top_p");
  expect_rejected([&](SamplingParams& p) { p.top_p = nan; }, "top_p");
  expect_rejected([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  expect_rejected([](SamplingParams& p) { p.min_p = -0.01f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.min_p = 1.5f; }, "min_p");
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_rejected([&](SamplingParams& p) { p.repetition_penalty = inf; }, "repetition_penalty");
  expect_rejected([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  expect_rejected([](SamplingParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty");
  expect_rejected([&](SamplingParams& p) { p.frequency_penalty = nan; }, "frequency_penalty");
  expect_rejected([](SamplingParams& p) { p.logprobs = -1; }, "logprobs");
  expect_rejected([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  expect_rejected([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  expect_rejected([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  expect_rejected([](SamplingParams& p) { p.min_tokens = p.max_tokens + 1; }, "min_tokens");
  expect_rejected([](SamplingParams& p) { p.stop_token_ids = {5, kVocab}; }, "stop_token_ids[1]");
  expect_rejected([](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids[0]");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{kVocab, 1.0f}}; }, "logit_bias[");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }, "logit_bias[3]");
  expect_rejected([](SamplingParams& p) { p.logit_bias = {{3, 1.0f}, {3, 2.0f}}; }, "twice");
}

TEST(SamplingParams, MessageEchoesTheValue) {
  SamplingParams params;
  params.top_p = 1.5f;
  EXPECT_EQ(params.validate(kVocab).message(),
            "sampling parameter top_p = 1.5 is out of range (allowed: (0, 1])");
}

TEST(SamplingParams, RejectsNonPositiveVocabulary) {
  EXPECT_EQ(SamplingParams().validate(0).code(), StatusCode::kInvalidArgument);
}

TEST(ResolveSamplingDefaults, RequestThenGenerationConfigThenBuiltIn) {
  SamplingParams base;
  base.seed = 7;
  base.max_tokens = 100;
  SamplingDefaults model;
  model.temperature = 0.6f;
  model.top_p = 0.95f;
  model.top_k = 20;

  // Nothing in the request: the model's values, built-in ones where the model has none.
  SamplingParams resolved = resolve_sampling_defaults(base, {}, model);
  EXPECT_EQ(resolved.temperature, 0.6f);
  EXPECT_EQ(resolved.top_p, 0.95f);
  EXPECT_EQ(resolved.top_k, 20);
  EXPECT_EQ(resolved.min_p, 0.0f);
  EXPECT_EQ(resolved.repetition_penalty, 1.0f);
  EXPECT_EQ(resolved.seed, 7u);
  EXPECT_EQ(resolved.max_tokens, 100);

  // The request wins, including an explicit value equal to the built-in default.
  SamplingDefaults request;
  request.temperature = 1.0f;
  request.top_k = -1;
  request.min_p = 0.1f;
  resolved = resolve_sampling_defaults(base, request, model);
  EXPECT_EQ(resolved.temperature, 1.0f);
  EXPECT_EQ(resolved.top_p, 0.95f);
  EXPECT_EQ(resolved.top_k, -1);
  EXPECT_EQ(resolved.min_p, 0.1f);

  // Neither: built-in defaults even if `base` carried other values.
  base.temperature = 0.3f;
  resolved = resolve_sampling_defaults(base, {}, {});
  EXPECT_EQ(resolved.temperature, 1.0f);
  EXPECT_EQ(resolved.top_p, 1.0f);
  EXPECT_EQ(resolved.top_k, 0);
}

}  // namespace
}  // namespace pdserve
