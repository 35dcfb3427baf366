#include "bench/serving/serving_benchmark.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>

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
                                                 Clock::duration timeout,
                                                 const std::string& api_key) {
  Result<std::string> body = co_await fetch_text(endpoint, "/v1/models", timeout, api_key);
  if (!body.ok()) co_return body.status();
  const nlohmann::json models = nlohmann::json::parse(*body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") ||
      !models["data"][0]["id"].is_string()) {
    co_return unavailable("GET /v1/models did not list a model: " + body->substr(0, 200));
  }
  co_return models["data"][0]["id"].get<std::string>();
}

// The messages before request `index`, turn k of a conversation whose first turn is request
// index - k: the system prompt, then each earlier user message and the answer it got.
std::vector<ChatMessage> conversation_so_far(const std::vector<BenchRequest>& requests,
                                             const std::vector<RequestOutcome>& outcomes,
                                             size_t index) {
  std::vector<ChatMessage> history;
  const BenchRequest& request = requests[index];
  if (!request.system_prompt.empty()) history.push_back({"system", request.system_prompt});
  for (size_t earlier = index - static_cast<size_t>(request.turn); earlier < index; ++earlier) {
    history.push_back({"user", requests[earlier].prompt_text});
    history.push_back({"assistant", outcomes[earlier].generated_text});
  }
  return history;
}

// Sends `request`; with `retry_for` > 0 a 429 answer is sent again after its Retry-After
// (without one: OpenAI's client backoff, 0.5 s doubling up to 8 s) while the next send would
// start within `retry_for` of the first. The outcome is the last answer's, timed from the first
// send as its client saw it, with the retries counted.
asio::awaitable<RequestOutcome> send_retrying_429(const Endpoint& endpoint,
                                                  const StreamRequest& request,
                                                  Clock::duration retry_for,
                                                  Clock::time_point run_start) {
  constexpr Clock::duration kMaxBackoff = std::chrono::seconds(8);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  const Clock::time_point give_up = Clock::now() + retry_for;
  Clock::duration backoff = std::chrono::milliseconds(500);
  double first_start_s = -1;
  for (int retries = 0;; ++retries) {
    RequestOutcome outcome = co_await stream_completion(endpoint, request, run_start);
    if (first_start_s < 0) first_start_s = outcome.start_s;
    const Clock::duration wait = outcome.retry_after_s
                                     ? std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(*outcome.retry_after_s))
                                     : backoff;
    if (outcome.http_status != 429 || Clock::now() + wait > give_up) {
      const double waited = outcome.start_s - first_start_s;
      outcome.start_s = first_start_s;
      outcome.e2e_s += waited;
      if (outcome.success) outcome.ttft_s += waited;
      outcome.retries = retries;
      co_return outcome;
    }
    backoff = std::min(2 * backoff, kMaxBackoff);
    timer.expires_after(wait);
    co_await timer.async_wait(asio::use_awaitable);
  }
}

// Takes the next conversation in arrival order (a request and the later turns that follow it;
// one request without multi-turn), waits for its arrival time, runs its turns one after the
// other; repeat. With N such workers at most N requests are in flight, and a conversation
// starts at its arrival time or when a worker frees up, whichever is later (a FIFO semaphore).
// A turn after a failed one is not sent: without the answer there is no conversation to go on.
asio::awaitable<void> worker(const Endpoint& endpoint, const StreamRequest& prototype,
                             Clock::duration retry_429_for,
                             const std::vector<BenchRequest>& requests, size_t& next,
                             Clock::time_point run_start, std::vector<RequestOutcome>& outcomes) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (next < requests.size()) {
    const size_t first = next++;
    while (next < requests.size() && requests[next].turn > 0) ++next;
    const size_t end = next;
    const auto arrival = run_start + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(requests[first].arrival_s));
    if (arrival > Clock::now()) {
      timer.expires_at(arrival);
      co_await timer.async_wait(asio::use_awaitable);
    }
    for (size_t index = first; index < end; ++index) {
      if (index > first && !outcomes[index - 1].success) {
        outcomes[index].error = "not sent: turn " + std::to_string(requests[index - 1].turn) +
                                " of its conversation failed";
        continue;
      }
      StreamRequest request = prototype;
      request.request = &requests[index];
      request.history = conversation_so_far(requests, outcomes, index);
      outcomes[index] = co_await send_retrying_429(endpoint, request, retry_429_for, run_start);
    }
  }
}

}  // namespace

namespace {

// (E2E - TTFT) / (tokens - 1) in ms; 0 for a one-token output, as vLLM counts it for goodput.
double tpot_ms_of(const RequestOutcome& outcome) {
  if (outcome.output_tokens <= 1) return 0;
  return (outcome.e2e_s - outcome.ttft_s) / (outcome.output_tokens - 1) * 1e3;
}

bool within(const std::optional<double>& objective_ms, double value_ms) {
  return !objective_ms || value_ms <= *objective_ms;
}

// Milliseconds over the completed requests; TPOT over those with more than one token.
struct LatencySamples {
  std::vector<double> ttft, tpot, itl, e2el;

  explicit LatencySamples(const std::vector<RequestOutcome>& outcomes) {
    for (const RequestOutcome& outcome : outcomes) {
      if (!outcome.success) continue;
      ttft.push_back(outcome.ttft_s * 1e3);
      e2el.push_back(outcome.e2e_s * 1e3);
      if (outcome.output_tokens > 1) tpot.push_back(tpot_ms_of(outcome));
      for (double gap : outcome.itl_s) itl.push_back(gap * 1e3);
    }
  }

  // `name` is one of kLatencyMetricNames.
  const std::vector<double>& of(std::string_view name) const {
    if (name == "ttft") return ttft;
    if (name == "tpot") return tpot;
    if (name == "itl") return itl;
    return e2el;
  }
};

}  // namespace

void summarize_outcomes(BenchmarkResult& result, const Slo& slo) {
  result.completed = result.failed = result.good = 0;
  result.total_input_tokens = result.total_output_tokens = 0;
  result.retries_429 = 0;
  double last_end = 0;
  for (const RequestOutcome& outcome : result.outcomes) {
    last_end = std::max(last_end, outcome.start_s + outcome.e2e_s);
    result.retries_429 += outcome.retries;
    if (!outcome.success) {
      ++result.failed;
      continue;
    }
    ++result.completed;
    result.total_input_tokens += outcome.prompt_tokens;
    result.total_output_tokens += outcome.output_tokens;
    if (within(slo.ttft_ms, outcome.ttft_s * 1e3) && within(slo.tpot_ms, tpot_ms_of(outcome)) &&
        within(slo.e2el_ms, outcome.e2e_s * 1e3)) {
      ++result.good;
    }
  }
  result.duration_s = last_end;
  if (last_end > 0) {
    result.request_throughput = result.completed / last_end;
    result.input_throughput = static_cast<double>(result.total_input_tokens) / last_end;
    result.output_throughput = static_cast<double>(result.total_output_tokens) / last_end;
    result.total_token_throughput = result.input_throughput + result.output_throughput;
    result.goodput = result.good / last_end;
  }
  const LatencySamples samples(result.outcomes);
  result.ttft_ms = summarize(samples.ttft);
  result.tpot_ms = summarize(samples.tpot);
  result.itl_ms = summarize(samples.itl);
  result.e2e_ms = summarize(samples.e2el);
}

Result<Slo> parse_goodput(const std::vector<std::string>& items) {
  const std::string usage =
      "--goodput takes KEY:MS items (KEY ttft, tpot or e2el; MS a number >= 0), got '";
  Slo slo;
  for (const std::string& item : items) {
    std::istringstream words(item);
    std::string pair;
    while (words >> pair) {
      const size_t colon = pair.find(':');
      if (colon == std::string::npos) return invalid_argument(usage + pair + "'");
      const std::string key = pair.substr(0, colon);
      const std::string value = pair.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      const double ms = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(ms) || ms < 0) {
        return invalid_argument(usage + pair + "'");
      }
      std::optional<double>* objective = key == "ttft"   ? &slo.ttft_ms
                                         : key == "tpot" ? &slo.tpot_ms
                                         : key == "e2el" ? &slo.e2el_ms
                                                         : nullptr;
      if (objective == nullptr) return invalid_argument(usage + pair + "': unknown metric");
      if (objective->has_value()) return invalid_argument("--goodput gives " + key + " twice");
      *objective = ms;
    }
  }
  if (!slo.any()) return invalid_argument("--goodput has no KEY:MS item");
  return slo;
}

namespace {

// The comma-separated fields of `csv`, each non-empty, or INVALID_ARGUMENT naming `flag`.
Result<std::vector<std::string>> split_csv(const std::string& csv, const char* flag) {
  std::vector<std::string> fields;
  size_t begin = 0;
  for (;;) {
    const size_t comma = csv.find(',', begin);
    fields.push_back(csv.substr(begin, comma == std::string::npos ? comma : comma - begin));
    if (fields.back().empty()) {
      return invalid_argument(std::string(flag) + " has an empty item in '" + csv + "'");
    }
    if (comma == std::string::npos) return fields;
    begin = comma + 1;
  }
}

}  // namespace

Result<std::vector<std::string>> parse_percentile_metrics(const std::string& csv) {
  PDS_ASSIGN_OR_RETURN(std::vector<std::string> names, split_csv(csv, "--percentile-metrics"));
  for (const std::string& name : names) {
    if (std::find(std::begin(kLatencyMetricNames), std::end(kLatencyMetricNames), name) ==
        std::end(kLatencyMetricNames)) {
      return invalid_argument("--percentile-metrics: unknown metric '" + name +
                              "' (known: ttft, tpot, itl, e2el)");
    }
  }
  return names;
}

Result<std::vector<double>> parse_metric_percentiles(const std::string& csv) {
  PDS_ASSIGN_OR_RETURN(std::vector<std::string> fields, split_csv(csv, "--metric-percentiles"));
  std::vector<double> percentiles;
  for (const std::string& field : fields) {
    char* end = nullptr;
    errno = 0;
    const double percent = std::strtod(field.c_str(), &end);
    if (*end != '\0' || errno != 0 || !(percent >= 0 && percent <= 100)) {
      return invalid_argument("--metric-percentiles: '" + field +
                              "' is not a percentile in [0, 100]");
    }
    percentiles.push_back(percent);
  }
  return percentiles;
}

std::string percentile_key_name(double percent) {
  if (percent == std::floor(percent)) return std::to_string(static_cast<long long>(percent));
  // Python prints floats below 1e-4 in exponent form (1e-05), others positionally (99.9).
  char text[64];
  const auto format = percent < 1e-4 ? std::chars_format::scientific : std::chars_format::fixed;
  const std::to_chars_result written =
      std::to_chars(std::begin(text), std::end(text), percent, format);
  return std::string(text, written.ptr);
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
  if (options.route == ApiRoute::kChatCompletions) {
    for (const BenchRequest& request : requests) {
      if (request.prompt_text.empty()) {
        return invalid_argument(
            "--endpoint /v1/chat/completions needs text prompts (--dataset-name sharegpt, or a "
            "--dataset-path JSONL file of text prompts), not token ids");
      }
    }
  }
  return capture_status([&]() -> Result<BenchmarkResult> {
    asio::io_context io;
    BenchmarkResult result;
    result.model = options.model;
    if (result.model.empty()) {
      std::optional<Result<std::string>> model;
      const Clock::duration timeout =
          std::min(options.request_timeout, Clock::duration(std::chrono::seconds(30)));
      auto fetch = [&]() -> asio::awaitable<void> {
        model.emplace(co_await first_model(options.endpoint, timeout, options.api_key));
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
    prototype.route = options.route;
    prototype.model = result.model;
    prototype.timeout = options.request_timeout;
    prototype.api_key = options.api_key;
    result.outcomes.resize(requests.size());
    const size_t workers =
        options.max_concurrency > 0
            ? std::min(requests.size(), static_cast<size_t>(options.max_concurrency))
            : requests.size();
    size_t next = 0;
    const Clock::time_point run_start = Clock::now();
    for (size_t i = 0; i < workers; ++i) {
      asio::co_spawn(io,
                     worker(options.endpoint, prototype, options.retry_429_for, requests, next,
                            run_start, result.outcomes),
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
  if (result.retries_429 > 0) {
    out += format_line("Retried HTTP 429 answers:", std::to_string(result.retries_429));
  }
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

namespace {

// vLLM's "date": local time as %Y%m%d-%H%M%S.
std::string vllm_date() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%d-%H%M%S", &local);
  return text;
}

// The keys of the JSON that `vllm bench serve --save-result --save-detailed` writes, with
// vLLM's units (seconds for per-request times, ms for the statistics), so its analysis scripts
// read this file. Keys both formats share ("label", "completed", "request_throughput", ...)
// already have vLLM's meaning and are not repeated.
void add_vllm_keys(Json& json, const BenchmarkResult& result, const WorkloadOptions& workload,
                   const RunOptions& options) {
  json["date"] = vllm_date();
  json["endpoint_type"] = options.backend;
  json["backend"] = options.backend;
  json["model_id"] = result.model;
  json["tokenizer_id"] = workload.sharegpt.tokenizer_path.empty()
                             ? Json(nullptr)
                             : Json(workload.sharegpt.tokenizer_path);
  json["num_prompts"] = workload.num_prompts;
  json["request_rate"] =
      std::isinf(workload.request_rate) ? Json("inf") : Json(workload.request_rate);
  json["burstiness"] = workload.burstiness;
  json["max_concurrency"] =
      options.max_concurrency > 0 ? Json(options.max_concurrency) : Json(nullptr);
  json["duration"] = result.duration_s;
  json["request_goodput"] = options.slo.any() ? Json(result.goodput) : Json(nullptr);
  json["total_token_throughput"] = result.total_token_throughput;
  Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(),
       itls = Json::array(), latencies = Json::array(), start_times = Json::array(),
       generated_texts = Json::array(), errors = Json::array();
  for (const RequestOutcome& outcome : result.outcomes) {
    input_lens.push_back(outcome.prompt_tokens);
    output_lens.push_back(outcome.success ? outcome.output_tokens : 0);  // vLLM: 0 when failed
    ttfts.push_back(outcome.ttft_s);
    itls.push_back(outcome.itl_s);
    latencies.push_back(outcome.e2e_s);
    start_times.push_back(outcome.start_s);
    generated_texts.push_back(outcome.generated_text);
    errors.push_back(outcome.error);
  }
  json["input_lens"] = std::move(input_lens);
  json["output_lens"] = std::move(output_lens);
  json["ttfts"] = std::move(ttfts);
  json["itls"] = std::move(itls);
  json["latencies"] = std::move(latencies);
  json["start_times"] = std::move(start_times);
  json["generated_texts"] = std::move(generated_texts);
  json["errors"] = std::move(errors);
  const LatencySamples samples(result.outcomes);
  for (const std::string& metric : options.percentile_metrics) {
    const std::vector<double>& values = samples.of(metric);
    json["mean_" + metric + "_ms"] = mean(values);
    json["median_" + metric + "_ms"] = percentile(values, 50);
    json["std_" + metric + "_ms"] = standard_deviation(values);
    for (double percent : options.metric_percentiles) {
      json["p" + percentile_key_name(percent) + "_" + metric + "_ms"] = percentile(values, percent);
    }
  }
}

}  // namespace

Json result_json(const BenchmarkResult& result, const WorkloadOptions& workload,
                 const RunOptions& options) {
  const std::string& dataset_path =
      workload.sharegpt.path.empty() ? workload.dataset_path : workload.sharegpt.path;
  Json json;
  json["label"] = options.label.empty() ? Json(nullptr) : Json(options.label);
  json["model"] = result.model;
  json["base_url"] = "http://" + options.endpoint.host + ":" + options.endpoint.port;
  json["config"] =
      Json{{"dataset", dataset_name(workload)},
           {"dataset_path", dataset_path.empty() ? Json(nullptr) : Json(dataset_path)},
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
           {"burstiness", workload.burstiness},
           {"endpoint", api_route_path(options.route)},
           {"max_concurrency",
            options.max_concurrency > 0 ? Json(options.max_concurrency) : Json(nullptr)},
           {"seed", workload.seed},
           {"request_timeout_s", std::chrono::duration<double>(options.request_timeout).count()},
           {"retry_429_s", std::chrono::duration<double>(options.retry_429_for).count()}};
  // Multi-turn: the records are conversation by conversation, turn r of each at r % num_turns.
  if (workload.num_turns > 0) json["config"]["num_turns"] = workload.num_turns;
  json["duration_s"] = result.duration_s;
  json["completed"] = result.completed;
  json["failed"] = result.failed;
  json["retries_429"] = result.retries_429;
  json["total_input_tokens"] = result.total_input_tokens;
  json["total_output_tokens"] = result.total_output_tokens;
  json["request_throughput"] = result.request_throughput;
  json["input_throughput"] = result.input_throughput;
  json["output_throughput"] = result.output_throughput;
  const auto slo_json = [](const std::optional<double>& value) {
    return value ? Json(*value) : Json(nullptr);
  };
  json["slo"] = Json{{"ttft_ms", slo_json(options.slo.ttft_ms)},
                     {"tpot_ms", slo_json(options.slo.tpot_ms)},
                     {"e2el_ms", slo_json(options.slo.e2el_ms)}};
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
                {"retries", outcome.retries},
                {"start_ms", outcome.start_s * 1e3},
                {"ttft_ms", outcome.ttft_s * 1e3},
                {"e2e_ms", outcome.e2e_s * 1e3},
                {"itl_ms", std::move(itl)}};
    if (!outcome.timeline.is_null()) record["timeline"] = outcome.timeline;
    requests.push_back(std::move(record));
  }
  json["requests"] = std::move(requests);
  add_vllm_keys(json, result, workload, options);
  return json;
}

}  // namespace pdserve::bench
