// pdserve-bench-cpu: CPU-backend throughput of a Qwen3 shape (synthetic weights), held against
// this machine's measured limits.
//  * memory bandwidth: a multithreaded read of a 1 GiB buffer, and a 1 GiB memcpy;
//  * decode at batch 1 and 8: time per step vs (weight bytes + KV bytes read) / read bandwidth;
//  * prefill of a 512-token prompt: time vs OpenBLAS sgemm on the same GEMM shapes (float32
//    weights, all threads), i.e. what the BLAS achieves on the model's matrix products.
#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/core/cli.h"
#include "common/model/checkpoint.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cpu_backend.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Bandwidth {
  double read_gbs = 0;
  double memcpy_gbs = 0;  // bytes copied per second (each byte is read once and written once)
};

Bandwidth measure_bandwidth(int threads) {
  const size_t count = (size_t{1} << 30) / sizeof(float);
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  Bandwidth result;
  for (int trial = 0; trial < 5; ++trial) {
    auto start = Clock::now();
    double total = 0;
#pragma omp parallel for reduction(+ : total) num_threads(threads) schedule(static)
    for (size_t i = 0; i < count; i += 16) {
      float lane = 0;
      for (size_t j = 0; j < 16; ++j) lane += a[i + j];
      total += lane;
    }
    const double read = static_cast<double>(count * sizeof(float)) / seconds_since(start) / 1e9;
    if (total < 0) std::puts("");  // keeps the reduction alive
    result.read_gbs = std::max(result.read_gbs, read);
    start = Clock::now();
    std::memcpy(b.data(), a.data(), count * sizeof(float));
    result.memcpy_gbs = std::max(result.memcpy_gbs, static_cast<double>(count * sizeof(float)) / seconds_since(start) / 1e9);
  }
  return result;
}

// Seconds for OpenBLAS to run every matrix product of a prefill of `tokens` tokens.
double blas_prefill_seconds(const ModelConfig& c, int tokens, int threads) {
  openblas_set_num_threads(threads);
  const int q = c.num_attention_heads * c.head_dim;
  const int kv = c.num_key_value_heads * c.head_dim;
  struct Gemm { int n, k; };
  const Gemm layer_gemms[] = {{q, c.hidden_size}, {kv, c.hidden_size}, {kv, c.hidden_size},
                              {c.hidden_size, q}, {c.intermediate_size, c.hidden_size},
                              {c.intermediate_size, c.hidden_size}, {c.hidden_size, c.intermediate_size}};
  double per_layer = 0;
  for (Gemm g : layer_gemms) {
    std::vector<float> x(static_cast<size_t>(tokens) * g.k, 0.01f), w(static_cast<size_t>(g.n) * g.k, 0.01f),
        y(static_cast<size_t>(tokens) * g.n);
    double best = 1e30;
    for (int trial = 0; trial < 3; ++trial) {
      auto start = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, g.n, g.k, 1.0f, x.data(), g.k,
                  w.data(), g.k, 0.0f, y.data(), g.n);
      best = std::min(best, seconds_since(start));
    }
    per_layer += best;
  }
  return per_layer * c.num_hidden_layers;
}

long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

struct Options {
  std::string config = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json";
  std::string model_dir = "/tmp/pdserve-bench-models/qwen3-0.6b-bf16";
  int prompt_len = 512;
  int context_len = 512;
  int decode_steps = 16;
  int threads = 0;
};

Status run(const Options& options) {
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();
  if (!std::filesystem::exists(std::filesystem::path(options.model_dir) / "config.json")) {
    std::printf("writing synthetic checkpoint %s ...\n", options.model_dir.c_str());
    SyntheticCheckpointOptions make;
    make.config_path = options.config;
    make.out_dir = options.model_dir;
    make.seed = 1;
    make.dtype = DType::kBF16;
    make.tokenizer_dir = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer";
    PDS_RETURN_IF_ERROR(write_synthetic_checkpoint(make).status());
  }
  PDS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options.model_dir));
  PDS_ASSIGN_OR_RETURN(Qwen3Weights weights, load_qwen3_weights(checkpoint, DType::kBF16));
  const ModelConfig config = weights.config;
  size_t weight_bytes = weights.lm_head.nbytes() + weights.final_norm.nbytes();
  for (const Qwen3LayerWeights& l : weights.layers) {
    for (const HostTensor* t : {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm,
                                &l.k_norm, &l.post_attention_layernorm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      weight_bytes += t->nbytes();
    }
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_cpu_backend(threads));
  PDS_ASSIGN_OR_RETURN(auto model, Qwen3Model::create(*backend, std::move(weights)));

  const int max_batch = 8;
  const int block_size = 16;
  const int max_len = std::max(options.prompt_len, options.context_len) + options.decode_steps + 1;
  const int blocks_per_seq = (max_len + block_size - 1) / block_size;
  ForwardLimits limits{std::max(options.prompt_len, options.context_len), max_batch, max_len};
  PDS_ASSIGN_OR_RETURN(ForwardContext context, ForwardContext::create(*backend, config, limits, block_size));
  const KvLayout kv_shape = kv_layout_for(config, blocks_per_seq * max_batch, block_size, DType::kF32);
  PDS_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(*backend, kv_shape));
  std::vector<float> logits(static_cast<size_t>(max_batch) * config.vocab_size);

  std::vector<std::vector<int32_t>> tables(max_batch, std::vector<int32_t>(static_cast<size_t>(blocks_per_seq)));
  for (int s = 0; s < max_batch; ++s) std::iota(tables[s].begin(), tables[s].end(), s * blocks_per_seq);
  std::vector<int32_t> prompt(static_cast<size_t>(std::max(options.prompt_len, options.context_len)));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 150000);

  const Bandwidth bw = measure_bandwidth(threads);
  std::printf("machine: %d threads, read bandwidth %.1f GB/s, memcpy %.1f GB/s\n", threads, bw.read_gbs, bw.memcpy_gbs);
  std::printf("model: %s, %d layers, weights read per decode step %.1f MB (bf16)\n", options.config.c_str(),
              config.num_hidden_layers, weight_bytes / 1e6);

  // Prefill of one prompt (one forward over prompt_len tokens).
  SequenceSlice prefill{std::span<const int32_t>(prompt).subspan(0, static_cast<size_t>(options.prompt_len)), 0, tables[0]};
  PDS_RETURN_IF_ERROR(model->forward({&prefill, 1}, cache, context, logits));  // warm-up
  double prefill_best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    auto start = Clock::now();
    PDS_RETURN_IF_ERROR(model->forward({&prefill, 1}, cache, context, logits));
    prefill_best = std::min(prefill_best, seconds_since(start));
  }
  const double blas_seconds = blas_prefill_seconds(config, options.prompt_len, threads);
  std::printf("| prefill %d tokens | %.1f tokens/s | %.3f s | OpenBLAS sgemm on the same GEMMs: %.3f s | ratio %.2fx |\n",
              options.prompt_len, options.prompt_len / prefill_best, prefill_best, blas_seconds,
              prefill_best / blas_seconds);

  // Decode: each sequence holds context_len tokens, then decode_steps steps of one token each.
  for (int batch : {1, max_batch}) {
    std::vector<SequenceSlice> slices;
    for (int s = 0; s < batch; ++s) {
      SequenceSlice fill{std::span<const int32_t>(prompt).subspan(0, static_cast<size_t>(options.context_len)), 0, tables[s]};
      PDS_RETURN_IF_ERROR(model->forward({&fill, 1}, cache, context, logits));
    }
    std::vector<int32_t> next(static_cast<size_t>(batch), 42);
    auto start = Clock::now();
    for (int step = 0; step < options.decode_steps; ++step) {
      slices.clear();
      for (int s = 0; s < batch; ++s) {
        slices.push_back({std::span<const int32_t>(&next[static_cast<size_t>(s)], 1), options.context_len + step, tables[s]});
      }
      PDS_RETURN_IF_ERROR(model->forward(slices, cache, context, logits));
    }
    const double step_seconds = seconds_since(start) / options.decode_steps;
    const double kv_bytes = static_cast<double>(kv_shape.bytes_per_token()) * (options.context_len + options.decode_steps / 2.0) * batch;
    const double limit_seconds = (static_cast<double>(weight_bytes) + kv_bytes) / (bw.read_gbs * 1e9);
    std::printf("| decode batch %d, context %d | %.2f tokens/s | %.1f ms/step | bandwidth limit %.1f ms/step | %.0f%% of roofline |\n",
                batch, options.context_len, batch / step_seconds, step_seconds * 1e3, limit_seconds * 1e3,
                100.0 * limit_seconds / step_seconds);
  }
  std::printf("peak resident memory: %ld MiB (KV pool %.0f MiB)\n", peak_rss_mib(), kv_shape.total_bytes() / 1048576.0);
  return {};
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-bench-cpu: CPU backend prefill/decode throughput against measured limits"};
  app.add_option("--config", options.config, "Qwen3 config.json whose shape to build")->capture_default_str();
  app.add_option("--model-dir", options.model_dir, "Where the synthetic checkpoint is (written if absent)")->capture_default_str();
  app.add_option("--prompt-len", options.prompt_len, "Prefill prompt length")->capture_default_str()->check(CLI::Range(1, 8192));
  app.add_option("--context-len", options.context_len, "Tokens in each sequence before decoding")->capture_default_str()->check(CLI::Range(1, 8192));
  app.add_option("--decode-steps", options.decode_steps, "Timed decode steps")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--threads", options.threads, "Threads (0: all cores)")->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
