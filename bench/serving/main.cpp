// pdserve-bench-serving: streaming load against an OpenAI-compatible /v1/completions endpoint
// (pdserve-decode, the proxy, or vLLM), in the spirit of vLLM's benchmark_serving. Random prompts
// are token ids, so input lengths are exact; ignore_eos makes output lengths exact.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

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
  std::string base_url = "http://127.0.0.1:8000";
  std::string request_rate = "inf";
  double request_timeout_s = 600;
  std::string result_json;
  RunOptions run;
  WorkloadOptions workload;
};

Status run(Options& options) {
  PDS_ASSIGN_OR_RETURN(options.run.endpoint, parse_base_url(options.base_url));
  PDS_ASSIGN_OR_RETURN(options.workload.request_rate, parse_request_rate(options.request_rate));
  if (!(options.request_timeout_s > 0) || !std::isfinite(options.request_timeout_s)) {
    return invalid_argument("--request-timeout must be a positive number of seconds");
  }
  options.run.request_timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options.request_timeout_s));
  if (options.dataset == "sharegpt-synthetic") {
    options.workload.lengths = LengthDistribution::kShareGptSynthetic;
  }
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
  CLI::App app{"pdserve-bench-serving: streaming load on POST /v1/completions"};
  app.add_option("--base-url", options.base_url, "Server, http://HOST[:PORT]")
      ->capture_default_str();
  app.add_option("--model", options.run.model, "Model name (default: the first of GET /v1/models)");
  app.add_option("--num-prompts", workload.num_prompts, "Requests to send")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  CLI::Option* dataset =
      app.add_option("--dataset", options.dataset,
                     "random: uniform lengths (--input-len, --output-len, --range-ratio); "
                     "sharegpt-synthetic: log-normal lengths clipped to --max-input-len, "
                     "--max-output-len")
          ->capture_default_str()
          ->check(CLI::IsMember({"random", "sharegpt-synthetic"}));
  app.add_option("--dataset-path", workload.dataset_path,
                 "JSONL prompts: {\"prompt\": [ids] or \"text\", \"output_len\": N} per line")
      ->excludes(dataset);
  app.add_option("--max-input-len", workload.max_input_len, "sharegpt-synthetic: input clip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-output-len", workload.max_output_len, "sharegpt-synthetic: output clip")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--input-len", workload.input_len,
                 "Unique prompt tokens per request (after the shared prefix)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--output-len", workload.output_len,
                 "Tokens to generate per request (ignore_eos); default of --dataset-path lines")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--range-ratio", workload.range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--shared-prefix-len", workload.shared_prefix_len,
                 "Tokens every prompt starts with")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--vocab-size", workload.vocab_size, "Prompt token ids are drawn from [0, N)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--seed", workload.seed, "Seed of the workload")->capture_default_str();
  app.add_option("--request-rate", options.request_rate,
                 "Poisson arrivals in requests/s; inf: all at once")
      ->capture_default_str();
  app.add_option("--max-concurrency", options.run.max_concurrency,
                 "Most requests in flight (closed loop); 0: no limit")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--request-timeout", options.request_timeout_s,
                 "Deadline of each request, seconds")
      ->capture_default_str();
  app.add_option("--slo-ttft-ms", options.run.slo.ttft_ms, "Goodput: TTFT objective in ms")
      ->check(CLI::PositiveNumber);
  app.add_option("--slo-tpot-ms", options.run.slo.tpot_ms, "Goodput: TPOT objective in ms")
      ->check(CLI::PositiveNumber);
  app.add_option("--result-json", options.result_json,
                 "Also write the result as JSON to this file");
  app.add_option("--label", options.run.label,
                 "Name of the setup (e.g. the topology) in the JSON; plots group files by it");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::bench::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
