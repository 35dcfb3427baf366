#include "bench/serving/serving_benchmark.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace pdserve::bench {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

// The first model id that GET /v1/models lists.
asio::awaitable<Result<std::string>> first_model(const Endpoint& endpoint,
                                                 Clock::duration timeout) {
  Result<std::string> body = co_await fetch_text(endpoint, "/v1/models", timeout);
  if (!body.ok()) co_return body.status();
  const nlohmann::json models = nlohmann::json::parse(*body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") ||
      !models["data"][0]["id"].is_string()) {
    co_return unavailable("GET /v1/models did not list a model: " + body->substr(0, 200));
  }
  co_return models["data"][0]["id"].get<std::string>();
}

// Takes the next request in arrival order, waits for its arrival time, runs it; repeat. With N
// such workers at most N requests are in flight, and a request starts at its arrival time or
// when a worker frees up, whichever is later (a FIFO semaphore).
asio::awaitable<void> worker(const Endpoint& endpoint, const StreamRequest& prototype,
                             const std::vector<BenchRequest>& requests, size_t& next,
                             Clock::time_point run_start, std::vector<RequestOutcome>& outcomes) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (next < requests.size()) {
    const size_t index = next++;
    const auto arrival = run_start + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(requests[index].arrival_s));
    if (arrival > Clock::now()) {
      timer.expires_at(arrival);
      co_await timer.async_wait(asio::use_awaitable);
    }
    StreamRequest request = prototype;
    request.request = &requests[index];
    outcomes[index] = co_await stream_completion(endpoint, request, run_start);
  }
}

}  // namespace

void summarize_outcomes(BenchmarkResult& result, const Slo& slo) {
  result.completed = result.failed = result.good = 0;
  result.total_input_tokens = result.total_output_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  double last_end = 0;
  for (const RequestOutcome& outcome : result.outcomes) {
    last_end = std::max(last_end, outcome.start_s + outcome.e2e_s);
    if (!outcome.success) {
      ++result.failed;
      continue;
    }
    ++result.completed;
    result.total_input_tokens += outcome.prompt_tokens;
    result.total_output_tokens += outcome.output_tokens;
    ttft.push_back(outcome.ttft_s * 1e3);
    e2e.push_back(outcome.e2e_s * 1e3);
    const bool has_tpot = outcome.output_tokens > 1;
    const double tpot_ms =
        has_tpot ? (outcome.e2e_s - outcome.ttft_s) / (outcome.output_tokens - 1) * 1e3 : 0;
    if (has_tpot) tpot.push_back(tpot_ms);
    const bool ttft_ok = slo.ttft_ms <= 0 || outcome.ttft_s * 1e3 <= slo.ttft_ms;
    const bool tpot_ok = slo.tpot_ms <= 0 || tpot_ms <= slo.tpot_ms;  // one token: no TPOT
    if (ttft_ok && tpot_ok) ++result.good;
    for (double gap : outcome.itl_s) itl.push_back(gap * 1e3);
  }
  result.duration_s = last_end;
  if (last_end > 0) {
    result.request_throughput = result.completed / last_end;
    result.input_throughput = static_cast<double>(result.total_input_tokens) / last_end;
    result.output_throughput = static_cast<double>(result.total_output_tokens) / last_end;
    result.goodput = result.good / last_end;
  }
  result.ttft_ms = summarize(ttft);
  result.tpot_ms = summarize(tpot);
  result.itl_ms = summarize(itl);
  result.e2e_ms = summarize(e2e);
}

namespace {

Json summary_json(const LatencySummary& summary) {
  return Json{{"count", summary.count}, {"mean", summary.mean}, {"p50", summary.p50},
              {"p90", summary.p90},     {"p99", summary.p99},   {"max", summary.max}};
}

std::string format_line(const char* label, const std::string& value) {
  char line[160];
  std::snprintf(line, sizeof(line), "%-34s %14s\n", label, value.c_str());
  return line;
}

std::string number(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string latency_lines(const char* name, const LatencySummary& summary) {
  std::string out = "---- " + std::string(name) + " (ms) ";
  out += std::string(49 - std::min<size_t>(out.size(), 49), '-') + "\n";
  out += format_line("Mean:", number(summary.mean, 2));
  out += format_line("P50:", number(summary.p50, 2));
  out += format_line("P90:", number(summary.p90, 2));
  out += format_line("P99:", number(summary.p99, 2));
  return out;
}

}  // namespace

Result<BenchmarkResult> run_benchmark(const RunOptions& options,
                                      const std::vector<BenchRequest>& requests) {
  return capture_status([&]() -> Result<BenchmarkResult> {
    asio::io_context io;
    BenchmarkResult result;
    result.model = options.model;
    if (result.model.empty()) {
      std::optional<Result<std::string>> model;
      const Clock::duration timeout =
          std::min(options.request_timeout, Clock::duration(std::chrono::seconds(30)));
      auto fetch = [&]() -> asio::awaitable<void> {
        model.emplace(co_await first_model(options.endpoint, timeout));
      };
      asio::co_spawn(io, fetch(), [](std::exception_ptr error) {
        if (error) std::rethrow_exception(error);
      });
      io.run();
      io.restart();
      if (!model->ok()) return model->status();
      result.model = **model;
    }

    StreamRequest prototype;
    prototype.model = result.model;
    prototype.timeout = options.request_timeout;
    result.outcomes.resize(requests.size());
    const size_t workers =
        options.max_concurrency > 0
            ? std::min(requests.size(), static_cast<size_t>(options.max_concurrency))
            : requests.size();
    size_t next = 0;
    const Clock::time_point run_start = Clock::now();
    for (size_t i = 0; i < workers; ++i) {
      asio::co_spawn(
          io, worker(options.endpoint, prototype, requests, next, run_start, result.outcomes),
          [](std::exception_ptr error) {
            if (error) std::rethrow_exception(error);
          });
    }
    io.run();
    summarize_outcomes(result, options.slo);
    return result;
  });
}

std::string format_report(const BenchmarkResult& result, const Slo& slo) {
  std::string out = "============ Serving Benchmark Result ============\n";
  out += format_line("Model:", result.model);
  out += format_line("Successful requests:", std::to_string(result.completed));
  out += format_line("Failed requests:", std::to_string(result.failed));
  out += format_line("Benchmark duration (s):", number(result.duration_s, 2));
  out += format_line("Total input tokens:", std::to_string(result.total_input_tokens));
  out += format_line("Total generated tokens:", std::to_string(result.total_output_tokens));
  out += format_line("Request throughput (req/s):", number(result.request_throughput, 3));
  out += format_line("Input token throughput (tok/s):", number(result.input_throughput, 2));
  out += format_line("Output token throughput (tok/s):", number(result.output_throughput, 2));
  if (slo.any()) {
    out += format_line("Good requests (within SLOs):", std::to_string(result.good));
    out += format_line("Request goodput (req/s):", number(result.goodput, 3));
  }
  out += latency_lines("Time to First Token", result.ttft_ms);
  out += latency_lines("Time per Output Token (excl. 1st)", result.tpot_ms);
  out += latency_lines("Inter-token Latency", result.itl_ms);
  out += latency_lines("End-to-end Latency", result.e2e_ms);
  std::map<std::string, int> errors;
  for (const RequestOutcome& outcome : result.outcomes) {
    if (!outcome.success) ++errors[outcome.error];
  }
  if (!errors.empty()) {
    out += "---- Errors ---------------------------------------\n";
    for (const auto& [message, count] : errors) {
      out += std::to_string(count) + " x " + message + "\n";
    }
  }
  out += "==================================================\n";
  return out;
}

Json result_json(const BenchmarkResult& result, const WorkloadOptions& workload,
                 const RunOptions& options) {
  Json json;
  json["label"] = options.label.empty() ? Json(nullptr) : Json(options.label);
  json["model"] = result.model;
  json["base_url"] = "http://" + options.endpoint.host + ":" + options.endpoint.port;
  json["config"] = Json{
      {"dataset", dataset_name(workload)},
      {"dataset_path", workload.dataset_path.empty() ? Json(nullptr) : Json(workload.dataset_path)},
      {"num_prompts", workload.num_prompts},
      {"input_len", workload.input_len},
      {"output_len", workload.output_len},
      {"range_ratio", workload.range_ratio},
      {"max_input_len", workload.max_input_len},
      {"max_output_len", workload.max_output_len},
      {"shared_prefix_len", workload.shared_prefix_len},
      // JSON has no infinity: null means all requests at once.
      {"request_rate",
       std::isinf(workload.request_rate) ? Json(nullptr) : Json(workload.request_rate)},
      {"max_concurrency",
       options.max_concurrency > 0 ? Json(options.max_concurrency) : Json(nullptr)},
      {"seed", workload.seed},
      {"request_timeout_s", std::chrono::duration<double>(options.request_timeout).count()}};
  json["duration_s"] = result.duration_s;
  json["completed"] = result.completed;
  json["failed"] = result.failed;
  json["total_input_tokens"] = result.total_input_tokens;
  json["total_output_tokens"] = result.total_output_tokens;
  json["request_throughput"] = result.request_throughput;
  json["input_throughput"] = result.input_throughput;
  json["output_throughput"] = result.output_throughput;
  const auto slo_json = [](double value) { return value > 0 ? Json(value) : Json(nullptr); };
  json["slo"] =
      Json{{"ttft_ms", slo_json(options.slo.ttft_ms)}, {"tpot_ms", slo_json(options.slo.tpot_ms)}};
  json["good_requests"] = result.good;
  json["goodput"] = result.goodput;
  json["ttft_ms"] = summary_json(result.ttft_ms);
  json["tpot_ms"] = summary_json(result.tpot_ms);
  json["itl_ms"] = summary_json(result.itl_ms);
  json["e2e_ms"] = summary_json(result.e2e_ms);
  Json requests = Json::array();
  for (const RequestOutcome& outcome : result.outcomes) {
    Json itl = Json::array();
    for (double gap : outcome.itl_s) itl.push_back(gap * 1e3);
    Json record{{"success", outcome.success},
                {"error", outcome.error},
                {"prompt_tokens", outcome.prompt_tokens},
                {"output_tokens", outcome.output_tokens},
                {"text_chunks", outcome.text_chunks},
                {"start_ms", outcome.start_s * 1e3},
                {"ttft_ms", outcome.ttft_s * 1e3},
                {"e2e_ms", outcome.e2e_s * 1e3},
                {"itl_ms", std::move(itl)}};
    if (!outcome.timeline.is_null()) record["timeline"] = outcome.timeline;
    requests.push_back(std::move(record));
  }
  json["requests"] = std::move(requests);
  return json;
}

}  // namespace pdserve::bench
