// A stand-in InferenceService that plays a script, for the OpenAI API server tests: every
// request's deltas come from its own engine thread, as the real engine's do.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/inference_service.h"

namespace pdserve::api_test {

using namespace std::chrono_literals;

// Every request produces the pieces of `script` (one token each), up to max_tokens, on its own
// engine thread; the final delta says kStop when the script ran out, kLength otherwise. With
// set_logprobs, step k's token and logprobs come from entry k (top cut to the request's
// `logprobs`). Timings are synthetic: queued kQueueTime, first token kTimeToFirstToken after
// arrival, then one token per kTimePerOutputToken.
constexpr auto kQueueTime = 30ms;
constexpr auto kTimeToFirstToken = 50ms;
constexpr auto kTimePerOutputToken = 20ms;

class FakeService : public InferenceService {
 public:
  explicit FakeService(std::vector<std::string> script) : script_(std::move(script)) {
    info_.name = "fake-model";
    info_.max_model_len = 64;
    info_.vocab_size = 151936;
    thread_ = std::thread([this] { run(); });
  }
  ~FakeService() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status submit(InferenceRequest request, DeltaSink sink) override {
    std::lock_guard lock(mutex_);
    if (queue_full_) return resource_exhausted("the waiting queue is full");
    submitted_.push_back(request.id);
    submitted_sampling_.push_back(request.sampling);
    jobs_.push_back({std::move(request), std::move(sink), 0});
    cv_.notify_all();
    return Status();
  }
  void abort(const std::string& id) override {
    std::lock_guard lock(mutex_);
    aborted_.insert(id);
    aborts_changed_.notify_all();
  }
  ServiceStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  const ModelInfo& model_info() const override { return info_; }

  void set_queue_full(bool full) {
    std::lock_guard lock(mutex_);
    queue_full_ = full;
  }
  void set_step_delay(std::chrono::milliseconds delay) { step_delay_ = delay; }
  // Before the first request (e.g. for prompts with tools).
  void set_max_model_len(int max_model_len) { info_.max_model_len = max_model_len; }
  void set_logprobs(std::vector<SampledTokenLogprobs> logprobs) { logprobs_ = std::move(logprobs); }
  void set_stats(const ServiceStats& stats) {
    std::lock_guard lock(mutex_);
    stats_ = stats;
  }
  // Requests whose id ends with `id_suffix` fail with `error` in place of token `at_token`.
  void fail_requests(std::string id_suffix, size_t at_token, Status error) {
    std::lock_guard lock(mutex_);
    failure_ = {std::move(id_suffix), at_token, std::move(error)};
  }
  std::vector<std::string> submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::set<std::string> aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }
  // The aborted ids once there are `count` of them, or those there are after 3 s.
  std::set<std::string> wait_for_aborts(size_t count) {
    std::unique_lock lock(mutex_);
    aborts_changed_.wait_for(lock, 3s, [&] { return aborted_.size() >= count; });
    return aborted_;
  }
  std::vector<SamplingParams> submitted_sampling() {
    std::lock_guard lock(mutex_);
    return submitted_sampling_;
  }
  // The longest call of a request's sink with a token delta: the engine thread's time.
  std::chrono::steady_clock::duration longest_sink_call() const { return longest_sink_call_; }

 private:
  struct Job {
    InferenceRequest request;
    DeltaSink sink;
    size_t produced;
  };

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping and drained
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      const bool aborted = aborted_.count(job.request.id) > 0 || stopping_;
      lock.unlock();
      step(job, aborted);
      lock.lock();
    }
  }

  // Emits one delta; requeues the job when it is not finished.
  void step(Job& job, bool aborted) {
    SequenceDelta delta;
    delta.request_id = job.request.id;
    delta.prompt_tokens = static_cast<int>(job.request.prompt_tokens.size());
    if (aborted) {
      delta.finished = true;
      delta.error = cancelled("aborted");
      job.sink(std::move(delta));
      return;
    }
    if (const std::optional<Status> error = injected_failure(job)) {
      delta.finished = true;
      delta.error = *error;
      job.sink(std::move(delta));
      return;
    }
    std::this_thread::sleep_for(step_delay_);
    delta.text = script_[job.produced];
    delta.token_ids = {static_cast<int32_t>(job.produced)};
    const SamplingParams& sampling = job.request.sampling;
    if (job.produced < logprobs_.size()) {
      SampledTokenLogprobs logprobs = logprobs_[job.produced];
      delta.token_ids = {logprobs.token};
      if (logprobs.top.size() > static_cast<size_t>(sampling.logprobs)) {
        logprobs.top.resize(static_cast<size_t>(sampling.logprobs));
      }
      if (sampling.want_logprobs) delta.logprobs.push_back(std::move(logprobs));
    }
    if (job.produced == 0 && sampling.prompt_logprobs) delta.prompt_logprobs = prompt_logprobs(job);
    ++job.produced;
    delta.completion_tokens = static_cast<int>(job.produced);
    const SteadyTime arrival = job.request.arrival;
    delta.timings.arrival = arrival;
    delta.timings.first_scheduled = arrival + kQueueTime;
    delta.timings.first_token = arrival + kTimeToFirstToken;
    if (job.produced == script_.size()) {
      delta.finished = true;
      delta.finish_reason = FinishReason::kStop;
    } else if (static_cast<int>(job.produced) >= job.request.sampling.max_tokens) {
      delta.finished = true;
      delta.finish_reason = FinishReason::kLength;
    }
    if (delta.finished) {
      delta.timings.finished =
          *delta.timings.first_token + kTimePerOutputToken * (delta.completion_tokens - 1);
    }
    const bool finished = delta.finished;
    const auto called = std::chrono::steady_clock::now();
    job.sink(std::move(delta));
    const auto took = std::chrono::steady_clock::now() - called;
    if (took > longest_sink_call_.load()) longest_sink_call_ = took;
    if (!finished) {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      cv_.notify_all();
    }
  }

  // Scripted prompt logprobs: prompt token p has logprob -0.5 p and rank 3, after tokens 0
  // (-0.25) and 1 (-0.375), as many of those as asked.
  static std::vector<PromptTokenLogprob> prompt_logprobs(const Job& job) {
    const std::vector<int32_t>& prompt = job.request.prompt_tokens;
    std::vector<TokenLogprob> top = {{0, -0.25f}, {1, -0.375f}};
    top.resize(std::min(top.size(), static_cast<size_t>(*job.request.sampling.prompt_logprobs)));
    std::vector<PromptTokenLogprob> positions;
    for (size_t p = 1; p < prompt.size(); ++p) {
      positions.push_back({prompt[p], -0.5f * static_cast<float>(p), 3, top});
    }
    return positions;
  }

  std::optional<Status> injected_failure(const Job& job) {
    std::lock_guard lock(mutex_);
    if (!failure_ || job.produced != failure_->at_token) return std::nullopt;
    const std::string& id = job.request.id;
    const std::string& suffix = failure_->id_suffix;
    if (id.size() < suffix.size() || id.compare(id.size() - suffix.size(), suffix.size(), suffix))
      return std::nullopt;
    return failure_->error;
  }

  struct Failure {
    std::string id_suffix;
    size_t at_token;
    Status error;
  };

  const std::vector<std::string> script_;
  ModelInfo info_;
  std::chrono::milliseconds step_delay_{0};
  std::vector<SampledTokenLogprobs> logprobs_;  // set before the first request
  mutable std::mutex mutex_;
  ServiceStats stats_;
  std::optional<Failure> failure_;
  std::condition_variable cv_;
  std::condition_variable aborts_changed_;
  std::deque<Job> jobs_;
  std::vector<std::string> submitted_;
  std::vector<SamplingParams> submitted_sampling_;
  std::set<std::string> aborted_;
  bool queue_full_ = false;
  bool stopping_ = false;
  std::atomic<std::chrono::steady_clock::duration> longest_sink_call_{};
  std::thread thread_;
};

}  // namespace pdserve::api_test
