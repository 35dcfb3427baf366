// pdserve-bench-draft: the cost of speculative decoding's draft-model proposer
// (kernels/model/draft_model_proposer.h) per proposed token, on the CPU backend, for a draft of
// the Qwen3-0.6B shape (synthetic weights) proposing k tokens for B sequences of --context
// tokens. Per batch it times:
//  * the first propose(): every prompt's KV computed by the draft (what a disaggregated decode
//    node pays per request, the draft's prompt KV being computed locally) plus k - 1 steps;
//  * steady propose() calls as the engine makes them: after all k proposals were accepted
//    (two tokens to compute, then k - 1 steps) and after the first was rejected (one token,
//    then k - 1 steps);
// beside the same run's limit: k forwards each reading every weight once at the measured read
// bandwidth. Prints figures only; it asserts nothing about speed.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/core/cli.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cpu_backend.h"
#include "kernels/model/draft_model_proposer.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of the whole process (every thread): on cores shared with other work the wall
// time counts the waits, this does not.
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

struct Timing {
  double wall_s = 0;
  double cpu_s = 0;
  Timing& operator+=(const Timing& other) {
    wall_s += other.wall_s;
    cpu_s += other.cpu_s;
    return *this;
  }
};

// Read bandwidth of a 1 GiB buffer summed by every thread, best of three (GB/s): by the wall
// clock, and per CPU-second times the threads (what the threads read while they ran).
struct Bandwidth {
  double wall_gbs = 0;
  double cpu_gbs = 0;
};

Bandwidth read_bandwidth(int threads) {
  const size_t count = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> data(count, 1);
  const double bytes = static_cast<double>(count * sizeof(uint64_t));
  Bandwidth best;
  for (int trial = 0; trial < 3; ++trial) {
    const Clock::time_point start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    uint64_t total = 0;
#pragma omp parallel for reduction(+ : total) num_threads(threads) schedule(static)
    for (size_t i = 0; i < count; i += 8) {
      total += ((data[i] + data[i + 1]) + (data[i + 2] + data[i + 3])) +
               ((data[i + 4] + data[i + 5]) + (data[i + 6] + data[i + 7]));
    }
    const double cpu = process_cpu_seconds() - cpu_start;
    if (total != count) std::puts("bandwidth: wrong sum");  // keeps the loop alive
    best.wall_gbs = std::max(best.wall_gbs, bytes / seconds_since(start) / 1e9);
    best.cpu_gbs = std::max(best.cpu_gbs, bytes * threads / cpu / 1e9);
  }
  return best;
}

// Bytes of weights one decode forward reads: every layer's matrices and the lm_head.
double weight_bytes_per_forward(const ModelConfig& c, size_t element_bytes) {
  const double q = static_cast<double>(c.num_attention_heads) * c.head_dim;
  const double kv = static_cast<double>(c.num_key_value_heads) * c.head_dim;
  const double h = c.hidden_size, inter = c.intermediate_size;
  const double layer = h * q * 2 + h * kv * 2 + 3 * h * inter;
  return (layer * c.num_hidden_layers + static_cast<double>(c.vocab_size) * h) *
         static_cast<double>(element_bytes);
}

struct Options {
  std::string config = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json";
  std::string model_dir = "/tmp/pdserve-bench-models/qwen3-0.6b-bf16";
  std::vector<int> batches = {1, 4, 16};
  int context = 512;
  int k = 4;
  int rounds = 3;
  int threads = 0;
  std::string kv_cache_dtype = "auto";
};

struct Row {
  int batch = 0;
  Timing first;             // the first call: prompts and k - 1 steps
  Timing accepted;          // steady calls after all k were accepted (all rounds)
  Timing rejected;          // steady calls after the first was rejected (all rounds)
  double weight_bytes = 0;  // one forward's weight reads
};

std::vector<int32_t> random_tokens(std::mt19937& random, size_t count) {
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = token(random);
  return tokens;
}

// Times one propose() over `tokens` (one sequence each) and returns its proposals.
Timing timed_propose(Proposer& proposer, const std::vector<std::vector<int32_t>>& tokens, int k,
                     std::vector<std::vector<int32_t>>& proposals) {
  std::vector<ProposalRequest> requests;
  for (size_t i = 0; i < tokens.size(); ++i) {
    requests.push_back({static_cast<SeqId>(i), tokens[i], k});
  }
  proposals.assign(tokens.size(), {});
  const Clock::time_point start = Clock::now();
  const double cpu_start = process_cpu_seconds();
  const Status status = proposer.propose(requests, proposals);
  const Timing timing{seconds_since(start), process_cpu_seconds() - cpu_start};
  PDS_CHECK(status.ok(), status.to_string());
  for (const std::vector<int32_t>& list : proposals) {
    PDS_CHECK(static_cast<int>(list.size()) == k, "a sequence got fewer proposals than asked");
  }
  return timing;
}

Result<Row> measure(const Options& options, const DraftModelProposerConfig& base, Backend& backend,
                    int batch) {
  DraftModelProposerConfig config = base;
  // Room for the prompts and every round's growth.
  const int positions = options.context + 2 * options.rounds * (options.k + 1) + options.k;
  config.num_blocks = batch * ((positions + config.block_size - 1) / config.block_size);
  config.limits.max_model_len = positions + config.block_size;
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelProposer> proposer,
                       DraftModelProposer::create(config, backend));
  std::mt19937 random(static_cast<uint32_t>(batch));
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(batch));
  for (std::vector<int32_t>& t : tokens)
    t = random_tokens(random, static_cast<size_t>(options.context));
  std::vector<std::vector<int32_t>> proposals;
  Row row;
  row.batch = batch;
  row.weight_bytes =
      weight_bytes_per_forward(proposer->draft_config(), dtype_size(proposer->weight_dtype()));
  row.first = timed_propose(*proposer, tokens, options.k, proposals);
  for (int round = 0; round < options.rounds; ++round) {
    // All accepted: the proposals and the target's bonus token join the sequence.
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i].insert(tokens[i].end(), proposals[i].begin(), proposals[i].end());
      tokens[i].push_back(random_tokens(random, 1)[0]);
    }
    row.accepted += timed_propose(*proposer, tokens, options.k, proposals);
    // The first rejected: only the target's own token joins.
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i].push_back((proposals[i][0] + 1) % 151936);
    }
    row.rejected += timed_propose(*proposer, tokens, options.k, proposals);
  }
  return row;
}

Status run(const Options& options) {
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();
  PDS_ASSIGN_OR_RETURN(const std::optional<DType> kv_dtype,
                       parse_kv_cache_dtype(options.kv_cache_dtype));
  if (!std::filesystem::exists(std::filesystem::path(options.model_dir) / "config.json")) {
    std::fprintf(stderr, "writing synthetic checkpoint %s ...\n", options.model_dir.c_str());
    SyntheticCheckpointOptions make;
    make.config_path = options.config;
    make.out_dir = options.model_dir;
    make.seed = 1;
    make.dtype = DType::kBF16;
    make.tokenizer_dir = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer";
    PDS_RETURN_IF_ERROR(write_synthetic_checkpoint(make).status());
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_cpu_backend(threads));
  DraftModelProposerConfig base;
  base.model = options.model_dir;
  base.num_speculative_tokens = options.k;
  base.kv_cache_dtype = kv_dtype;
  base.limits.max_num_tokens = options.context;
  base.limits.max_num_seqs = *std::max_element(options.batches.begin(), options.batches.end());
  base.target_vocab_size = 151936;  // Qwen3's; the draft's own config must agree

  const Bandwidth bandwidth = read_bandwidth(threads);
  std::printf("backend: %s; draft %s, k = %d, context %d, %d steady rounds of each kind\n",
              backend->description().c_str(), options.model_dir.c_str(), options.k, options.context,
              options.rounds);
  std::printf(
      "read bandwidth (same run): %.1f GB/s by the wall clock, %.1f GB/s per busy thread "
      "time x %d threads\n",
      bandwidth.wall_gbs, bandwidth.cpu_gbs, threads);
  std::printf(
      "ms: wall / busy (process CPU time / %d threads: the wall time on otherwise idle "
      "cores); per proposed token: a steady call's time / (batch x k)\n\n",
      threads);
  std::printf(
      "| batch | first call (prompts + k-1 steps) ms | prompt ms per token | steady call, all "
      "accepted ms | per proposed token ms | steady call, first rejected ms | per "
      "proposed token ms | limit: k weight reads ms (wall / busy bandwidth) |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const int batch : options.batches) {
    PDS_ASSIGN_OR_RETURN(const Row row, measure(options, base, *backend, batch));
    const double proposed = static_cast<double>(batch) * options.k;
    const double prompt_tokens = static_cast<double>(batch) * options.context;
    const auto ms = [&](const Timing& t, double per) {
      char text[64];
      std::snprintf(text, sizeof(text), "%.1f / %.1f", t.wall_s * 1e3 / per,
                    t.cpu_s * 1e3 / threads / per);
      return std::string(text);
    };
    const double reads = options.k * row.weight_bytes / 1e9 * 1e3;
    std::printf("| %d | %s | %s | %s | %s | %s | %s | %.1f / %.1f |\n", batch,
                ms(row.first, 1).c_str(), ms(row.first, prompt_tokens).c_str(),
                ms(row.accepted, options.rounds).c_str(),
                ms(row.accepted, options.rounds * proposed).c_str(),
                ms(row.rejected, options.rounds).c_str(),
                ms(row.rejected, options.rounds * proposed).c_str(), reads / bandwidth.wall_gbs,
                reads / bandwidth.cpu_gbs);
    std::fflush(stdout);
  }
  return Status::ok_status();
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-bench-draft: the draft-model proposer's cost per proposed token (CPU)"};
  app.add_option("--config", options.config, "Qwen3 config.json of the draft's shape")
      ->capture_default_str();
  app.add_option("--model-dir", options.model_dir,
                 "The synthetic draft checkpoint (written if absent)")
      ->capture_default_str();
  app.add_option("--batches", options.batches, "Sequences per propose() (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--context", options.context, "Tokens of each sequence")
      ->capture_default_str()
      ->check(CLI::Range(1, 8192));
  app.add_option("--k", options.k, "Proposals per sequence")
      ->capture_default_str()
      ->check(CLI::Range(1, pdserve::kMaxDraftSpeculativeTokens));
  app.add_option("--rounds", options.rounds, "Timed steady calls of each kind")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--threads", options.threads, "Threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--kv-cache-dtype", options.kv_cache_dtype, "Draft KV: auto, bfloat16, float32")
      ->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  const pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
