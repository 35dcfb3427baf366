// pdserve-bench-cpu: CPU-backend throughput of a Qwen3 shape (synthetic weights), held against
// this machine's limits measured in the same run:
//  * memory: a multithreaded read of a 1 GiB buffer (and a 1 GiB memcpy);
//  * compute: OpenBLAS sgemm on the model's GEMM shapes (float32, all threads) and, on CPUs
//    with AVX512_BF16, the peak of a register-only vdpbf16ps loop on all threads;
//  * prefill of one prompt per --prefill length: time vs the sgemm time of the same GEMMs;
//  * decode of --decode batch:context pairs: time per step vs (weight bytes + KV bytes read) /
//    read bandwidth. The context is prefilled once and copied into every sequence's own blocks.
// --json prints one JSON object per line instead of the tables (for bench/peer).
#include <cblas.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>
#include <vector>

#include "bench/cpu_model/peak_flops.h"
#include "common/core/cli.h"
#include "common/model/checkpoint.h"
#include "common/model/host_buffer.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cpu_backend.h"
#include "kernels/model/kv_cache.h"
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

// Read bandwidth: every thread sums its share of a 1 GiB buffer as 64-bit integers into eight
// independent accumulators (no dependency chain, no vector reduction to untangle), so the loop
// is limited by memory, not by the adds. Best of five. The buffers are on transparent huge
// pages, as the weights and the KV pool are (allocate_host_buffer): on 4 KiB pages the TLB
// misses held this probe to 15 GB/s on a host whose decode steps streamed 24-39 GB/s.
Bandwidth measure_bandwidth(int threads) {
  const size_t count = (size_t{1} << 30) / sizeof(uint64_t);
  const auto a_bytes = allocate_host_buffer(count * sizeof(uint64_t));
  const auto b_bytes = allocate_host_buffer(count * sizeof(uint64_t));
  auto* a = reinterpret_cast<uint64_t*>(a_bytes.get());
  auto* b = reinterpret_cast<uint64_t*>(b_bytes.get());
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < count; ++i) {
    a[i] = 1;
    b[i] = 0;
  }
  Bandwidth result;
  for (int trial = 0; trial < 5; ++trial) {
    auto start = Clock::now();
    uint64_t total = 0;
#pragma omp parallel for reduction(+ : total) num_threads(threads) schedule(static)
    for (size_t i = 0; i < count; i += 8) {
      uint64_t lanes[8];
      for (size_t j = 0; j < 8; ++j) lanes[j] = a[i + j];
      total += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
    const double read = static_cast<double>(count * sizeof(uint64_t)) / seconds_since(start) / 1e9;
    if (total != count) std::puts("bandwidth: wrong sum");  // keeps the loop alive
    result.read_gbs = std::max(result.read_gbs, read);
    start = Clock::now();
    std::memcpy(b, a, count * sizeof(uint64_t));
    result.memcpy_gbs = std::max(result.memcpy_gbs, static_cast<double>(count * sizeof(uint64_t)) / seconds_since(start) / 1e9);
  }
  return result;
}

struct Gemm {
  int n, k;
};

std::vector<Gemm> layer_gemms(const ModelConfig& c) {
  const int q = c.num_attention_heads * c.head_dim;
  const int kv = c.num_key_value_heads * c.head_dim;
  return {{q, c.hidden_size},  {kv, c.hidden_size}, {kv, c.hidden_size}, {c.hidden_size, q},
          {c.intermediate_size, c.hidden_size}, {c.intermediate_size, c.hidden_size},
          {c.hidden_size, c.intermediate_size}};
}

double layer_flops(const ModelConfig& c, int tokens) {
  double flops = 0;
  for (Gemm g : layer_gemms(c)) flops += 2.0 * tokens * g.n * g.k;
  return flops;
}

// Seconds for OpenBLAS to run every matrix product of a prefill of `tokens` tokens.
double blas_prefill_seconds(const ModelConfig& c, int tokens, int threads) {
  openblas_set_num_threads(threads);
  double per_layer = 0;
  for (Gemm g : layer_gemms(c)) {
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

struct DecodePoint {
  int batch = 1;
  int context = 0;
};

struct Options {
  std::string config = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json";
  std::string model_dir = "/tmp/pdserve-bench-models/qwen3-0.6b-bf16";
  std::vector<std::string> prefill = {"512"};
  std::vector<std::string> decode = {"1:512", "8:512"};
  int decode_steps = 16;
  int prefill_repeats = 3;
  int threads = 0;
  std::string isa = "auto";
  std::string kv_cache_dtype = "auto";
  bool ceilings = true;
  bool json = false;
  bool fp8 = false;  // write the synthetic checkpoint with FP8 projections (when absent)
};

// "none" (alone) selects no point.
bool is_none(const std::vector<std::string>& specs) { return specs.size() == 1 && specs[0] == "none"; }

Result<std::vector<int>> parse_prefill_lengths(const std::vector<std::string>& specs) {
  std::vector<int> lengths;
  if (is_none(specs)) return lengths;
  for (const std::string& spec : specs) {
    int length = 0;
    std::istringstream in(spec);
    if (!(in >> length) || !in.eof() || length < 1 || length > 32768) {
      return invalid_argument("--prefill: '" + spec + "' is not a prompt length in [1, 32768]");
    }
    lengths.push_back(length);
  }
  return lengths;
}

Result<std::vector<DecodePoint>> parse_decode_points(const std::vector<std::string>& specs) {
  std::vector<DecodePoint> points;
  if (is_none(specs)) return points;
  for (const std::string& spec : specs) {
    DecodePoint point;
    char colon = 0;
    std::istringstream in(spec);
    if (!(in >> point.batch >> colon >> point.context) || colon != ':' || !in.eof() ||
        point.batch < 1 || point.batch > 256 || point.context < 0 || point.context > 32768) {
      return invalid_argument("--decode: '" + spec +
                              "' is not BATCH:CONTEXT with BATCH in [1, 256] and CONTEXT in [0, 32768]");
    }
    points.push_back(point);
  }
  return points;
}

// Gives sequences 1..batch-1 their own copy of sequence 0's KV for `context` tokens (the same
// prompt gives the same K and V): one prefill instead of `batch` before a decode point, each
// sequence still reading its own blocks. Sequence s owns blocks [s * blocks_per_seq, ...).
void copy_context(const KvCache& cache, int context, int blocks_per_seq, int batch) {
  const KvLayout& layout = cache.layout();
  const int blocks = (context + layout.block_size - 1) / layout.block_size;
  auto* base = static_cast<std::byte*>(cache.data());
  for (int s = 1; s < batch; ++s) {
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (bool value_half : {false, true}) {
        std::memcpy(base + layout.offset(layer, s * blocks_per_seq, value_half),
                    base + layout.offset(layer, 0, value_half),
                    static_cast<size_t>(blocks) * layout.layer_block_bytes());
      }
    }
  }
}

Status run(const Options& options) {
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();
  PDS_ASSIGN_OR_RETURN(const CpuIsa requested_isa, parse_cpu_isa(options.isa));
  PDS_ASSIGN_OR_RETURN(const std::vector<int> prefill_lengths, parse_prefill_lengths(options.prefill));
  PDS_ASSIGN_OR_RETURN(const std::vector<DecodePoint> decode_points, parse_decode_points(options.decode));
  PDS_ASSIGN_OR_RETURN(const std::optional<DType> kv_choice, parse_kv_cache_dtype(options.kv_cache_dtype));
  if (!std::filesystem::exists(std::filesystem::path(options.model_dir) / "config.json")) {
    std::fprintf(stderr, "writing synthetic checkpoint %s ...\n", options.model_dir.c_str());
    SyntheticCheckpointOptions make;
    make.config_path = options.config;
    make.out_dir = options.model_dir;
    make.seed = 1;
    make.dtype = DType::kBF16;
    make.fp8 = options.fp8;
    make.tokenizer_dir = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer";
    PDS_RETURN_IF_ERROR(write_synthetic_checkpoint(make).status());
  }
  PDS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options.model_dir));
  PDS_ASSIGN_OR_RETURN(Qwen3Weights weights, load_qwen3_weights(checkpoint, DType::kBF16,
                                                                   WeightPlacement::kHostHugePages));
  const ModelConfig config = weights.config;
  size_t weight_bytes = weights.lm_head.nbytes() + weights.final_norm.nbytes();
  for (const Qwen3LayerWeights& l : weights.layers) {
    for (const HostTensor* t : {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm,
                                &l.k_norm, &l.post_attention_layernorm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      weight_bytes += t->nbytes() + static_cast<size_t>(t->scale_count()) * sizeof(float);
    }
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_cpu_backend(threads, requested_isa));
  const CpuIsa isa = cpu_backend_isa(*backend);
  PDS_ASSIGN_OR_RETURN(auto model, Qwen3Model::create(*backend, std::move(weights)));
  const DType kv_dtype = kv_choice.value_or(backend->default_kv_dtype(model->weight_dtype()));

  // One pool and workspace large enough for every measurement.
  const int block_size = 16;
  int max_tokens = 1, max_batch = 1, max_len = 1;
  for (int length : prefill_lengths) {
    max_tokens = std::max(max_tokens, length);
    max_len = std::max(max_len, length);
  }
  int pool_tokens = max_len;
  for (DecodePoint point : decode_points) {
    max_batch = std::max(max_batch, point.batch);
    max_tokens = std::max({max_tokens, point.context, point.batch});
    max_len = std::max(max_len, point.context + options.decode_steps + 1);
    pool_tokens = std::max(pool_tokens, point.batch * (point.context + options.decode_steps + 1));
  }
  const int blocks_per_seq = (max_len + block_size - 1) / block_size;
  const int num_blocks = std::max(blocks_per_seq * max_batch, (pool_tokens + block_size - 1) / block_size);
  ForwardLimits limits{max_tokens, max_batch, max_len};
  PDS_ASSIGN_OR_RETURN(ForwardContext context, ForwardContext::create(*backend, config, limits, block_size));
  const KvLayout kv_shape = kv_layout_for(config, num_blocks, block_size, kv_dtype);
  PDS_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(*backend, kv_shape));
  std::vector<float> logits(static_cast<size_t>(max_batch) * config.vocab_size);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch), std::vector<int32_t>(static_cast<size_t>(blocks_per_seq)));
  for (int s = 0; s < max_batch; ++s) std::iota(tables[s].begin(), tables[s].end(), s * blocks_per_seq);
  std::vector<int32_t> prompt(static_cast<size_t>(max_tokens));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % 150000);

  const std::string isa_name(cpu_isa_name(isa));
  const std::string kv_name(dtype_name(kv_dtype));
  Bandwidth bw;
  double sgemm_gflops = 0, bf16_peak_gflops = 0;
  if (options.ceilings) {
    bw = measure_bandwidth(threads);
    const int ceiling_tokens = 512;
    sgemm_gflops = layer_flops(config, ceiling_tokens) * config.num_hidden_layers /
                   blas_prefill_seconds(config, ceiling_tokens, threads) / 1e9;
    if (cpu_supports(CpuIsa::kAvx512Bf16)) bf16_peak_gflops = bf16_dot_peak_gflops(threads);
    if (options.json) {
      std::printf("{\"kind\":\"ceilings\",\"threads\":%d,\"read_gbs\":%.2f,\"memcpy_gbs\":%.2f,"
                  "\"sgemm_gflops\":%.1f,\"bf16_dot_peak_gflops\":%.1f}\n",
                  threads, bw.read_gbs, bw.memcpy_gbs, sgemm_gflops, bf16_peak_gflops);
    } else {
      std::printf("machine: %d threads, read bandwidth %.1f GB/s, memcpy %.1f GB/s\n", threads, bw.read_gbs,
                  bw.memcpy_gbs);
      std::printf("compute: OpenBLAS sgemm on the model's GEMMs (512 tokens) %.1f GFLOP/s; vdpbf16ps peak %.1f GFLOP/s%s\n",
                  sgemm_gflops, bf16_peak_gflops, bf16_peak_gflops > 0 ? "" : " (no AVX512_BF16)");
    }
  }
  if (!options.json) {
    std::printf("model: %s, %d layers, weights read per decode step %.1f MB (%s); level %s, KV %s\n",
                options.config.c_str(), config.num_hidden_layers, weight_bytes / 1e6,
                config.quantization ? "FP8 projections, bf16 rest" : "bf16", isa_name.c_str(),
                kv_name.c_str());
  }

  for (int length : prefill_lengths) {
    SequenceSlice prefill{std::span<const int32_t>(prompt).subspan(0, static_cast<size_t>(length)), 0, tables[0]};
    PDS_RETURN_IF_ERROR(model->forward({&prefill, 1}, cache, context, logits));  // warm-up
    double best = 1e30;
    for (int trial = 0; trial < options.prefill_repeats; ++trial) {
      auto start = Clock::now();
      PDS_RETURN_IF_ERROR(model->forward({&prefill, 1}, cache, context, logits));
      best = std::min(best, seconds_since(start));
    }
    const double gflops = (layer_flops(config, length) * config.num_hidden_layers) / best / 1e9;
    if (options.json) {
      std::printf("{\"kind\":\"prefill\",\"tokens\":%d,\"seconds\":%.4f,\"tok_s\":%.2f,\"linear_gflops\":%.1f,"
                  "\"isa\":\"%s\",\"kv\":\"%s\",\"threads\":%d}\n",
                  length, best, length / best, gflops, isa_name.c_str(), kv_name.c_str(), threads);
    } else {
      std::printf("| prefill %d tokens | %.1f tokens/s | %.3f s | linear layers at %.1f GFLOP/s |\n", length,
                  length / best, best, gflops);
    }
  }

  // Sequence 0 holds the KV of the prompt's first `prompt_in_seq0` tokens (a prefill above
  // left its prompt; a decode point overwrites from its context on): a decode point at a
  // context it covers reuses it rather than prefilling again.
  int prompt_in_seq0 = prefill_lengths.empty() ? 0 : prefill_lengths.back();
  for (DecodePoint point : decode_points) {
    if (point.context > prompt_in_seq0) {
      SequenceSlice fill{
          std::span<const int32_t>(prompt).subspan(0, static_cast<size_t>(point.context)), 0,
          tables[0]};
      PDS_RETURN_IF_ERROR(model->forward({&fill, 1}, cache, context, logits));
    }
    copy_context(cache, point.context, blocks_per_seq, point.batch);
    prompt_in_seq0 = point.context;
    std::vector<int32_t> next(static_cast<size_t>(point.batch), 42);
    std::vector<SequenceSlice> slices;
    const auto step = [&](int index) {
      slices.clear();
      for (int s = 0; s < point.batch; ++s) {
        slices.push_back({std::span<const int32_t>(&next[static_cast<size_t>(s)], 1), point.context + index, tables[s]});
      }
      return model->forward(slices, cache, context, logits);
    };
    PDS_RETURN_IF_ERROR(step(0));  // warm-up (rewritten by the first timed step)
    auto start = Clock::now();
    for (int index = 0; index < options.decode_steps; ++index) PDS_RETURN_IF_ERROR(step(index));
    const double step_seconds = seconds_since(start) / options.decode_steps;
    const double kv_bytes = static_cast<double>(kv_shape.bytes_per_token()) *
                            (point.context + options.decode_steps / 2.0) * point.batch;
    const double limit_seconds = bw.read_gbs > 0 ? (static_cast<double>(weight_bytes) + kv_bytes) / (bw.read_gbs * 1e9) : 0;
    if (options.json) {
      std::printf("{\"kind\":\"decode\",\"batch\":%d,\"context\":%d,\"ms_per_step\":%.3f,\"tok_s\":%.2f,"
                  "\"step_bytes\":%.0f,\"roofline_ms\":%.3f,\"isa\":\"%s\",\"kv\":\"%s\",\"threads\":%d}\n",
                  point.batch, point.context, step_seconds * 1e3, point.batch / step_seconds,
                  static_cast<double>(weight_bytes) + kv_bytes, limit_seconds * 1e3, isa_name.c_str(), kv_name.c_str(),
                  threads);
    } else {
      std::printf("| decode batch %d, context %d | %.2f tokens/s | %.1f ms/step | bandwidth limit %.1f ms/step | %.0f%% of roofline |\n",
                  point.batch, point.context, point.batch / step_seconds, step_seconds * 1e3, limit_seconds * 1e3,
                  100.0 * limit_seconds / step_seconds);
    }
  }
  if (!options.json) {
    std::printf("peak resident memory: %ld MiB (KV pool %.0f MiB)\n", peak_rss_mib(), kv_shape.total_bytes() / 1048576.0);
  }
  return {};
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-bench-cpu: CPU backend prefill/decode throughput against measured limits"};
  app.add_option("--config", options.config, "Qwen3 config.json whose shape to build")->capture_default_str();
  app.add_option("--model-dir", options.model_dir, "Where the synthetic checkpoint is (written if absent)")->capture_default_str();
  app.add_option("--prefill", options.prefill, "Prompt lengths to prefill (comma-separated, or none)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--decode", options.decode, "Decode points BATCH:CONTEXT (comma-separated, or none)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--decode-steps", options.decode_steps, "Timed decode steps")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--prefill-repeats", options.prefill_repeats, "Timed prefills per length (the best counts)")
      ->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--threads", options.threads, "Threads (0: all cores)")->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--isa", options.isa, "Instruction-set level: auto, portable, avx2, avx512, avx512_bf16")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", options.kv_cache_dtype, "KV cache element type: auto, bfloat16, float32, fp8")
      ->capture_default_str();
  app.add_flag("!--no-ceilings", options.ceilings, "Skip measuring the bandwidth and GEMM ceilings");
  app.add_flag("--fp8", options.fp8,
               "Write the synthetic checkpoint (when --model-dir has none) with FP8 projections "
               "(pdserve-make-model --fp8)");
  app.add_flag("--json", options.json, "One JSON object per measurement instead of tables");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
