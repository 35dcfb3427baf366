// pdserve-bench-serving: streaming load against an OpenAI-compatible /v1/completions or
// /v1/chat/completions endpoint (pdserve-decode, the proxy, or vLLM) that takes the flags of
// `vllm bench serve` and writes its result keys. Random prompts are token ids, so input lengths
// are exact; ignore_eos makes output lengths exact.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/serving/serving_benchmark.h"
#include "common/core/cli.h"

namespace pdserve::bench {
namespace {

Result<double> parse_request_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  errno = 0;
  const double rate = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(rate) || rate <= 0) {
    return invalid_argument("--request-rate must be a positive number of requests/s or inf (got '" +
                            text + "')");
  }
  return rate;
}

struct Options {
  std::string dataset = "random";
  bool dataset_given = false;
  int num_turns = 0;  // 0: not given
  bool output_len_given = false;
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string backend;  // empty: the one vLLM uses for the endpoint
  std::string request_rate = "inf";
  double request_timeout_s = 600;
  double retry_429_s = 0;
  std::string result_json;
  std::optional<double> slo_ttft_ms;
  std::optional<double> slo_tpot_ms;
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  RunOptions run;
  WorkloadOptions workload;
};

// The route of --endpoint, and a --backend that agrees with it (vLLM's openai and vllm post to
// /v1/completions, openai-chat to /v1/chat/completions).
Status resolve_route(Options& options) {
  PDS_ASSIGN_OR_RETURN(options.run.route, parse_api_route(options.endpoint));
  const bool chat = options.run.route == ApiRoute::kChatCompletions;
  if (options.backend.empty()) {
    options.run.backend = chat ? "openai-chat" : "openai";
  } else if ((options.backend == "openai-chat") != chat) {
    return invalid_argument("--backend " + options.backend + " does not post to --endpoint " +
                            options.endpoint);
  } else {
    options.run.backend = options.backend;
  }
  return {};
}

// --dataset-name with --dataset-path: a JSONL prompt file without a name, vLLM's ShareGPT JSON
// with "sharegpt"; the synthetic datasets take no file.
Status resolve_dataset(Options& options) {
  WorkloadOptions& workload = options.workload;
  if (options.dataset == "sharegpt") {
    if (workload.dataset_path.empty()) {
      return invalid_argument(
          "--dataset-name sharegpt needs --dataset-path (vLLM's ShareGPT JSON)");
    }
    workload.sharegpt.path = std::move(workload.dataset_path);
    workload.dataset_path.clear();
    // vLLM's --output-len stands for --sharegpt-output-len too.
    if (!workload.sharegpt.output_len && options.output_len_given) {
      workload.sharegpt.output_len = workload.output_len;
    }
    return {};
  }
  if (options.dataset == "multiturn") {
    if (options.run.route != ApiRoute::kChatCompletions) {
      return invalid_argument(
          "--dataset-name multiturn sends conversations: it needs --endpoint "
          "/v1/chat/completions");
    }
    workload.num_turns = options.num_turns > 0 ? options.num_turns : 3;
  } else if (options.num_turns > 0) {
    return invalid_argument("--num-turns is for --dataset-name multiturn");
  }
  if (options.dataset_given && !workload.dataset_path.empty()) {
    return invalid_argument("--dataset-path excludes --dataset-name " + options.dataset +
                            " (a JSONL prompt file takes no --dataset-name; vLLM's ShareGPT JSON "
                            "takes --dataset-name sharegpt)");
  }
  if (options.dataset == "sharegpt-synthetic") {
    workload.lengths = LengthDistribution::kShareGptSynthetic;
  }
  return {};
}

Status run(Options& options) {
  PDS_ASSIGN_OR_RETURN(options.run.endpoint, parse_base_url(options.base_url));
  PDS_RETURN_IF_ERROR(resolve_route(options));
  PDS_ASSIGN_OR_RETURN(options.workload.request_rate, parse_request_rate(options.request_rate));
  PDS_RETURN_IF_ERROR(resolve_dataset(options));
  if (!options.goodput.empty()) {
    PDS_ASSIGN_OR_RETURN(options.run.slo, parse_goodput(options.goodput));
  } else {
    options.run.slo.ttft_ms = options.slo_ttft_ms;
    options.run.slo.tpot_ms = options.slo_tpot_ms;
  }
  PDS_ASSIGN_OR_RETURN(options.run.percentile_metrics,
                       parse_percentile_metrics(options.percentile_metrics));
  PDS_ASSIGN_OR_RETURN(options.run.metric_percentiles,
                       parse_metric_percentiles(options.metric_percentiles));
  if (!(options.request_timeout_s > 0) || !std::isfinite(options.request_timeout_s)) {
    return invalid_argument("--request-timeout must be a positive number of seconds");
  }
  options.run.request_timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options.request_timeout_s));
  if (!(options.retry_429_s >= 0) || !std::isfinite(options.retry_429_s)) {
    return invalid_argument("--retry-429 must be a number of seconds >= 0");
  }
  options.run.retry_429_for = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options.retry_429_s));
  // As vLLM's benchmark: the API key comes from the environment, not the command line.
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr) options.run.api_key = key;
  PDS_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests, make_workload(options.workload));

  PDS_ASSIGN_OR_RETURN(BenchmarkResult result, run_benchmark(options.run, requests));
  std::fputs(format_report(result, options.run.slo).c_str(), stdout);
  if (!options.result_json.empty()) {
    std::ofstream file(options.result_json);
    file << result_json(result, options.workload, options.run).dump(2) << '\n';
    if (!file) return internal_error("cannot write --result-json " + options.result_json);
  }
  if (result.failed > 0) {
    return failed_precondition(std::to_string(result.failed) + " of " +
                               std::to_string(requests.size()) + " requests failed");
  }
  return {};
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::bench::Options options;
  pdserve::bench::WorkloadOptions& workload = options.workload;
  CLI::App app{
      "pdserve-bench-serving: streaming load on POST /v1/completions or /v1/chat/completions, "
      "with the flags and result keys of `vllm bench serve`"};
  app.add_option("--base-url", options.base_url, "Server, http://HOST[:PORT]")
      ->capture_default_str();
  app.add_option("--endpoint", options.endpoint,
                 "API route: /v1/completions or /v1/chat/completions (the prompt as the user "
                 "turn; text prompts only)")
      ->capture_default_str();
  app.add_option("--backend", options.backend,
                 "vLLM's backend name, written to the JSON; must match --endpoint (default: "
                 "openai, or openai-chat for /v1/chat/completions)")
      ->check(CLI::IsMember({"openai", "vllm", "openai-chat"}));
  app.add_option("--model", options.run.model, "Model name (default: the first of GET /v1/models)");
  app.add_option("--num-prompts", workload.num_prompts, "Requests to send")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  CLI::Option* dataset =
      app.add_option("--dataset,--dataset-name", options.dataset,
                     "random: uniform lengths (--input-len, --output-len, --range-ratio); "
                     "sharegpt-synthetic: log-normal lengths clipped to --max-input-len, "
                     "--max-output-len; sharegpt: vLLM's ShareGPT JSON at --dataset-path, "
                     "measured with --tokenizer; multiturn: --num-prompts chat conversations "
                     "of --num-turns turns of random words (--input-len words a message)")
          ->capture_default_str()
          ->check(CLI::IsMember({"random", "sharegpt-synthetic", "sharegpt", "multiturn"}));
  app.add_option("--num-turns", options.num_turns,
                 "multiturn: turns per conversation (default 3); each sends the conversation so "
                 "far and is sent when the answer to the previous one has arrived")
      ->check(CLI::Range(1, 1000));
  app.add_option("--dataset-path", workload.dataset_path,
                 "Without --dataset-name: JSONL prompts, {\"prompt\": [ids] or \"text\", "
                 "\"output_len\": N} per line; with --dataset-name sharegpt: vLLM's ShareGPT JSON");
  app.add_option("--tokenizer", workload.sharegpt.tokenizer_path,
                 "sharegpt: tokenizer.json, or the model directory holding it, that counts "
                 "prompt and reply tokens");
  app.add_option("--sharegpt-output-len", workload.sharegpt.output_len,
                 "sharegpt: max_tokens of every request instead of the reply's token count")
      ->check(CLI::Range(1, 1 << 24));
  app.add_flag(
      "--disable-shuffle", [&](int64_t) { workload.sharegpt.shuffle = false; },
      "sharegpt: take conversations in file order instead of shuffled with --seed");
  app.add_flag(
      "--no-oversample", [&](int64_t) { workload.sharegpt.oversample = false; },
      "sharegpt: send fewer than --num-prompts when fewer conversations pass the "
      "length filter, instead of repeating random ones");
  app.add_option("--max-input-len", workload.max_input_len, "sharegpt-synthetic: input clip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-output-len", workload.max_output_len, "sharegpt-synthetic: output clip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--input-len,--random-input-len", workload.input_len,
                 "Unique prompt tokens per request (after the shared prefix)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  CLI::Option* output_len =
      app.add_option("--output-len,--random-output-len", workload.output_len,
                     "Tokens to generate per request (ignore_eos); default of --dataset-path "
                     "lines; with sharegpt, as --sharegpt-output-len")
          ->capture_default_str()
          ->check(CLI::Range(1, 1 << 24));
  app.add_option("--range-ratio,--random-range-ratio", workload.range_ratio,
                 "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--shared-prefix-len,--random-prefix-len", workload.shared_prefix_len,
                 "Tokens every prompt starts with")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--vocab-size", workload.vocab_size, "Prompt token ids are drawn from [0, N)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--seed", workload.seed, "Seed of the workload")->capture_default_str();
  app.add_option("--request-rate", options.request_rate,
                 "Arrivals in requests/s (Poisson, or gamma with --burstiness); inf: all at once")
      ->capture_default_str();
  app.add_option("--burstiness", workload.burstiness,
                 "Gamma shape of the gaps between arrivals: 1 Poisson, < 1 burstier, > 1 more "
                 "regular")
      ->capture_default_str();
  app.add_option("--max-concurrency", options.run.max_concurrency,
                 "Most requests in flight (closed loop); 0: no limit")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--request-timeout", options.request_timeout_s,
                 "Deadline of each request, seconds")
      ->capture_default_str();
  app.add_option("--retry-429", options.retry_429_s,
                 "Send a request answered HTTP 429 again, after its Retry-After (else a backoff "
                 "from 0.5 s doubling to 8 s), for up to this many seconds after its first send "
                 "(counted as retries; TTFT and latency from the first send); 0: a 429 fails it")
      ->capture_default_str();
  app.add_flag("--ignore-eos")
      ->description(
          "Always on here (every request sends ignore_eos); accepted for vLLM command lines");
  CLI::Option* slo_ttft =
      app.add_option("--slo-ttft-ms", options.slo_ttft_ms, "Goodput: TTFT objective in ms")
          ->check(CLI::PositiveNumber);
  CLI::Option* slo_tpot =
      app.add_option("--slo-tpot-ms", options.slo_tpot_ms, "Goodput: TPOT objective in ms")
          ->check(CLI::PositiveNumber);
  app.add_option("--goodput", options.goodput,
                 "Goodput objectives as vLLM takes them: KEY:MS items, KEY ttft, tpot or e2el "
                 "(e.g. --goodput ttft:500 tpot:50)")
      ->excludes(slo_ttft)
      ->excludes(slo_tpot);
  app.add_option("--percentile-metrics", options.percentile_metrics,
                 "Comma-separated metrics (ttft, tpot, itl, e2el) whose mean, median, std and "
                 "percentiles the JSON gets under vLLM's keys")
      ->capture_default_str();
  app.add_option("--metric-percentiles", options.metric_percentiles,
                 "Comma-separated percentiles for --percentile-metrics (p99 -> p99_ttft_ms)")
      ->capture_default_str();
  app.add_option("--result-json,--result-filename", options.result_json,
                 "Also write the result as JSON to this file");
  app.add_option("--label", options.run.label,
                 "Name of the setup (e.g. the topology) in the JSON; plots group files by it");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  options.dataset_given = dataset->count() > 0;
  options.output_len_given = output_len->count() > 0;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::bench::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
