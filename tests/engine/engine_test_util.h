// Small builders shared by the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/engine/inference_service.h"
#include "common/engine/sequence.h"

namespace pdserve::testing {

inline constexpr int kTestVocab = 64;
inline constexpr int32_t kTestEos = 0;

inline SamplingParams greedy_params(int max_tokens, bool ignore_eos = true) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = ignore_eos;
  return params;
}

inline Sequence make_sequence(SeqId id, std::vector<int32_t> prompt, int max_tokens = 16) {
  const int32_t eos[] = {kTestEos};
  Result<StopChecker> stop = StopChecker::create(greedy_params(max_tokens), eos, kTestVocab);
  EXPECT_TRUE(stop.ok()) << stop.status().to_string();
  return Sequence(id, std::move(prompt), greedy_params(max_tokens), std::move(stop).value(),
                  static_cast<uint64_t>(id), std::chrono::steady_clock::now());
}

// Everything one request received from the engine, in order.
struct Stream {
  std::vector<SequenceDelta> deltas;
  int finals = 0;

  std::vector<int32_t> tokens() const {
    std::vector<int32_t> all;
    for (const SequenceDelta& d : deltas)
      all.insert(all.end(), d.token_ids.begin(), d.token_ids.end());
    return all;
  }
  std::string text() const {
    std::string all;
    for (const SequenceDelta& d : deltas) all += d.text;
    return all;
  }
  const SequenceDelta& last() const { return deltas.back(); }
};

// 1, 2, ..., n shifted by `first - 1`.
inline std::vector<int32_t> iota_tokens(int n, int32_t first = 1) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(first + i);
  return tokens;
}

}  // namespace pdserve::testing
