#include "bench/serving/workload.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <string>

#include "bench/serving/prompt_file.h"
#include "bench/serving/sharegpt_dataset.h"

namespace pdserve::bench {
namespace {

// vLLM's random dataset rule: uniform in [floor(len * (1 - r)), ceil(len * (1 + r))], at least 1.
int random_length(int len, double range_ratio, std::mt19937_64& rng) {
  const int low = std::max(1, static_cast<int>(std::floor(len * (1 - range_ratio))));
  const int high = std::max(low, static_cast<int>(std::ceil(len * (1 + range_ratio))));
  return std::uniform_int_distribution<int>(low, high)(rng);
}

int log_normal_length(double log_mean, double log_sigma, int max_len, std::mt19937_64& rng) {
  const double tokens = std::round(std::lognormal_distribution<double>(log_mean, log_sigma)(rng));
  return static_cast<int>(std::clamp(tokens, 1.0, static_cast<double>(max_len)));
}

Result<std::vector<BenchRequest>> file_workload(const WorkloadOptions& options) {
  PDS_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests,
                       read_prompt_file(options.dataset_path, options.output_len));
  if (requests.size() > static_cast<size_t>(options.num_prompts)) {
    requests.resize(static_cast<size_t>(options.num_prompts));
  }
  assign_arrivals(requests, options.request_rate, options.burstiness, options.seed);
  return requests;
}

// `count` words of kMultiTurnWords separated by spaces.
std::string random_words(int count, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> word(0, std::size(kMultiTurnWords) - 1);
  std::string text;
  for (int i = 0; i < count; ++i) {
    if (i > 0) text += ' ';
    text += kMultiTurnWords[word(rng)];
  }
  return text;
}

std::vector<BenchRequest> multiturn_workload(const WorkloadOptions& options) {
  std::mt19937_64 rng(options.seed);
  const std::string system_prompt = random_words(options.shared_prefix_len, rng);
  ArrivalGaps gaps(options.request_rate, options.burstiness);
  std::vector<BenchRequest> requests;
  requests.reserve(static_cast<size_t>(options.num_prompts) * options.num_turns);
  double arrival = 0;
  for (int conversation = 0; conversation < options.num_prompts; ++conversation) {
    for (int turn = 0; turn < options.num_turns; ++turn) {
      BenchRequest& request = requests.emplace_back();
      request.prompt_text =
          random_words(random_length(options.input_len, options.range_ratio, rng), rng);
      request.output_len = random_length(options.output_len, options.range_ratio, rng);
      request.arrival_s = arrival;
      request.turn = turn;
      request.system_prompt = system_prompt;
    }
    arrival += gaps.next(rng);
  }
  return requests;
}

}  // namespace

Status validate(const WorkloadOptions& options) {
  if (options.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  if (options.input_len < 1) return invalid_argument("--input-len must be at least 1");
  if (options.output_len < 1) return invalid_argument("--output-len must be at least 1");
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return invalid_argument("--range-ratio must be in [0, 1), got " +
                            std::to_string(options.range_ratio));
  }
  if (options.shared_prefix_len < 0) return invalid_argument("--shared-prefix-len must be >= 0");
  if (!(options.request_rate > 0)) {
    return invalid_argument("--request-rate must be a positive number or inf");
  }
  if (!(options.burstiness > 0) || std::isinf(options.burstiness)) {
    return invalid_argument("--burstiness must be a positive number, got " +
                            std::to_string(options.burstiness));
  }
  if (options.vocab_size < 1) return invalid_argument("--vocab-size must be at least 1");
  if (options.max_input_len < 1) return invalid_argument("--max-input-len must be at least 1");
  if (options.max_output_len < 1) return invalid_argument("--max-output-len must be at least 1");
  if (options.num_turns < 0) return invalid_argument("--num-turns must be at least 1");
  return {};
}

std::string dataset_name(const WorkloadOptions& options) {
  if (options.num_turns > 0) return "multiturn";
  if (!options.sharegpt.path.empty()) return "sharegpt";
  if (!options.dataset_path.empty()) return "file";
  return options.lengths == LengthDistribution::kShareGptSynthetic ? "sharegpt-synthetic"
                                                                   : "random";
}

Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options) {
  PDS_RETURN_IF_ERROR(validate(options));
  if (!options.sharegpt.path.empty()) {
    PDS_ASSIGN_OR_RETURN(
        std::vector<BenchRequest> requests,
        read_sharegpt_workload(options.sharegpt, options.num_prompts, options.seed));
    assign_arrivals(requests, options.request_rate, options.burstiness, options.seed);
    return requests;
  }
  if (!options.dataset_path.empty()) return file_workload(options);
  if (options.num_turns > 0) return multiturn_workload(options);
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int32_t> token(0, options.vocab_size - 1);
  std::vector<int32_t> prefix(static_cast<size_t>(options.shared_prefix_len));
  for (int32_t& id : prefix) id = token(rng);

  const bool sharegpt = options.lengths == LengthDistribution::kShareGptSynthetic;
  ArrivalGaps gaps(options.request_rate, options.burstiness);
  std::vector<BenchRequest> requests(static_cast<size_t>(options.num_prompts));
  double arrival = 0;
  // Draw order (input length, tokens, output length, gap) keeps a seed's random workload stable.
  for (BenchRequest& request : requests) {
    const int unique_len = sharegpt
                               ? log_normal_length(kShareGptInputLogMean, kShareGptInputLogSigma,
                                                   options.max_input_len, rng)
                               : random_length(options.input_len, options.range_ratio, rng);
    request.prompt = prefix;
    for (int i = 0; i < unique_len; ++i) request.prompt.push_back(token(rng));
    request.output_len = sharegpt
                             ? log_normal_length(kShareGptOutputLogMean, kShareGptOutputLogSigma,
                                                 options.max_output_len, rng)
                             : random_length(options.output_len, options.range_ratio, rng);
    request.arrival_s = arrival;
    arrival += gaps.next(rng);
  }
  return requests;
}

ArrivalGaps::ArrivalGaps(double request_rate, double burstiness)
    : all_at_once_(std::isinf(request_rate)),
      poisson_(burstiness == 1),
      exponential_(all_at_once_ ? 1.0 : request_rate),
      gamma_(burstiness, all_at_once_ ? 1.0 : 1 / (request_rate * burstiness)) {}

double ArrivalGaps::next(std::mt19937_64& rng) {
  if (all_at_once_) return 0;
  // Gamma with shape 1 is the exponential; drawing it as such keeps the arrival times of seeded
  // workloads from before --burstiness existed.
  return poisson_ ? exponential_(rng) : gamma_(rng);
}

void assign_arrivals(std::vector<BenchRequest>& requests, double request_rate, double burstiness,
                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  ArrivalGaps gaps(request_rate, burstiness);
  double arrival = 0;
  for (BenchRequest& request : requests) {
    request.arrival_s = arrival;
    arrival += gaps.next(rng);
  }
}

}  // namespace pdserve::bench
