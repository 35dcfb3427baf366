#include "common/engine/warm_up.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace pdserve {
namespace {

constexpr int kPromptTokens = 8;
constexpr int kGeneratedTokens = 2;

// Shared with the sink, which the engine may call after warm_up gave up waiting.
struct WarmUpResult {
  std::mutex mutex;
  std::condition_variable finished;
  std::optional<SequenceDelta> final_delta;
  int tokens = 0;
};

}  // namespace

Result<WarmUpReport> warm_up(InferenceService& service, std::chrono::milliseconds deadline) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t tokens_before = service.stats().generation_tokens_total;
  InferenceRequest request;
  request.id = "pdserve-warm-up";
  // Any ids of the vocabulary do: nothing reads the text.
  const int vocab = std::max(1, service.model_info().vocab_size);
  for (int i = 0; i < kPromptTokens; ++i) request.prompt_tokens.push_back((i * 97 + 1) % vocab);
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = kGeneratedTokens;
  request.sampling.ignore_eos = true;

  auto result = std::make_shared<WarmUpResult>();
  PDS_RETURN_IF_ERROR(
      service
          .submit(std::move(request),
                  [result](SequenceDelta delta) {
                    std::lock_guard lock(result->mutex);
                    result->tokens += static_cast<int>(delta.token_ids.size());
                    if (delta.finished) {
                      result->final_delta = std::move(delta);
                      result->finished.notify_all();
                    }
                  })
          .with_context("warm-up"));
  std::unique_lock lock(result->mutex);
  if (!result->finished.wait_for(lock, deadline, [&] { return result->final_delta.has_value(); })) {
    lock.unlock();
    service.abort("pdserve-warm-up");
    return deadline_exceeded("warm-up: one short request did not finish within " +
                             std::to_string(deadline.count()) + " ms");
  }
  if (!result->final_delta->error.ok()) {
    return result->final_delta->error.with_context("warm-up");
  }
  // The engine publishes its stats after the step that delivered the final delta: wait for
  // them, so that a node's counters, which start from the stats after its warm-up, never count
  // a warm-up token.
  const int generated = result->tokens;
  const int64_t tokens_after = tokens_before + generated;
  lock.unlock();
  while (service.stats().generation_tokens_total < tokens_after) {
    if (std::chrono::steady_clock::now() - start > deadline) {
      return deadline_exceeded("warm-up: the engine's stats did not count its tokens within " +
                               std::to_string(deadline.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  WarmUpReport report;
  report.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  report.generated_tokens = generated;
  return report;
}

}  // namespace pdserve
