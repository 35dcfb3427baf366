// pdserve-bench-gpu: the CUDA backend against its own rooflines, measured in the same run.
// First the device's HBM bandwidth (device-to-device copy) and GEMM peaks (the backend's
// linear at 8192^3: bf16, and FP8 with --weights fp8); then, for Qwen3 shapes with constant
// weights (bench_weights.h: throughput does not depend on their values), decode tokens/s at
// several batch sizes over 1k-token contexts and prefill tokens/s of one 4k prompt, each beside
// the bound those peaks put on it. The steps run through the engine's Qwen3ModelRunner (decode
// CUDA graphs, sampling on the GPU, one wait per step), so the figures are the product's; an
// eager forward without sampling is shown beside them. The KV pool is sized from the memory
// left free once the model is placed (bench_kv_plan.h); a batch size that does not fit is
// reported as skipped.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "bench/gpu/bench_kv_plan.h"
#include "bench/gpu/bench_weights.h"
#include "common/core/cli.h"
#include "common/core/dtype.h"
#include "common/engine/scheduler.h"
#include "common/engine/sequence.h"
#include "common/model/model_config.h"
#include "common/model/qwen3_weights.h"
#include "kernels/backend.h"
#include "kernels/model/device_step_path.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/model_runner.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {
namespace {

constexpr int kBlockSize = 16;

// configs/models, or the folder PDSERVE_ASSETS_DIR names (a GPU bundle's copy).
std::filesystem::path assets_dir() {
  const char* value = std::getenv("PDSERVE_ASSETS_DIR");
  return value != nullptr && *value != '\0' ? value : PDSERVE_ASSETS_DIR;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Times `repeats` runs of `step` after one warm-up, synchronizing around them.
template <typename Step>
Result<double> time_per_run(Backend& backend, int repeats, Step step) {
  PDS_RETURN_IF_ERROR(step());
  PDS_RETURN_IF_ERROR(backend.synchronize());
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) PDS_RETURN_IF_ERROR(step());
  PDS_RETURN_IF_ERROR(backend.synchronize());
  return seconds_since(start) / repeats;
}

struct Peaks {
  double bytes_per_second = 0;
  double bf16_flops_per_second = 0;
  double fp8_flops_per_second = 0;  // measured only for --weights fp8
};

// The backend's linear at n^3: bf16 activations times a bf16 weight, or times an FP8 weight
// with 128 x 128 block scales (the path the model's projections take: activations quantized
// per token and 128-element group, one block-scaled GEMM).
Result<double> gemm_flops_per_second(Backend& backend, BenchWeights weights, int repeats) {
  const int64_t n = 8192;
  const size_t elements = static_cast<size_t>(n * n);
  const std::vector<uint16_t> activations(elements, float_to_bf16(0.01f));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer a, backend.allocate(elements * sizeof(uint16_t)));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer c, backend.allocate(elements * sizeof(uint16_t)));
  PDS_RETURN_IF_ERROR(
      backend.copy_to_device(a.data(), activations.data(), elements * sizeof(uint16_t)));
  const HostTensor w = constant_projection(weights, n, n);
  PDS_ASSIGN_OR_RETURN(DeviceBuffer b, backend.allocate(w.nbytes()));
  PDS_RETURN_IF_ERROR(backend.copy_to_device(b.data(), w.data, w.nbytes()));
  MatrixView weight = MatrixView::dense(b.data(), w.dtype, n, n);
  DeviceBuffer scales;
  if (w.scale != nullptr) {
    const size_t scale_bytes = static_cast<size_t>(w.scale_count()) * sizeof(float);
    PDS_ASSIGN_OR_RETURN(scales, backend.allocate(scale_bytes));
    PDS_RETURN_IF_ERROR(backend.copy_to_device(scales.data(), w.scale, scale_bytes));
    weight.scale = scales.as<float>();
    weight.scale_block_n = w.scale_block_n;
    weight.scale_block_k = w.scale_block_k;
  }
  const MatrixView in = MatrixView::dense(a.data(), DType::kBF16, n, n);
  const MatrixView out = MatrixView::dense(c.data(), DType::kBF16, n, n);
  PDS_ASSIGN_OR_RETURN(double seconds, time_per_run(backend, repeats, [&] {
                         return backend.linear(in, weight, out);
                       }));
  return 2.0 * static_cast<double>(n * n * n) / seconds;
}

Result<Peaks> measure_peaks(Backend& backend, BenchWeights weights, int repeats) {
  Peaks peaks;
  {
    const size_t bytes = size_t{1} << 30;
    PDS_ASSIGN_OR_RETURN(DeviceBuffer source, backend.allocate(bytes));
    PDS_ASSIGN_OR_RETURN(DeviceBuffer target, backend.allocate(bytes));
    PDS_ASSIGN_OR_RETURN(double copy_seconds, time_per_run(backend, repeats, [&] {
                           return backend.copy_to_device(target.data(), source.data(), bytes);
                         }));
    peaks.bytes_per_second = 2.0 * static_cast<double>(bytes) / copy_seconds;  // read + write
  }
  PDS_ASSIGN_OR_RETURN(peaks.bf16_flops_per_second,
                       gemm_flops_per_second(backend, BenchWeights::kBF16, repeats));
  if (weights == BenchWeights::kFp8) {
    PDS_ASSIGN_OR_RETURN(peaks.fp8_flops_per_second,
                         gemm_flops_per_second(backend, BenchWeights::kFp8, repeats));
  }
  return peaks;
}

// Multiply-adds per token: the layers' projections (FP8 GEMMs with FP8 weights) and the rest
// (lm_head and embeddings' share, always bf16), and the seconds `tokens` of them take at the
// peaks.
struct GemmWork {
  double projection_params = 0;
  double other_params = 0;
  double seconds(double tokens, const Peaks& peaks, BenchWeights weights) const {
    const double projection_rate =
        weights == BenchWeights::kFp8 ? peaks.fp8_flops_per_second : peaks.bf16_flops_per_second;
    return 2.0 * tokens *
           (projection_params / projection_rate + other_params / peaks.bf16_flops_per_second);
  }
};

GemmWork gemm_work(const ModelConfig& config) {
  ModelConfig no_layers = config;
  no_layers.num_hidden_layers = 0;
  GemmWork work;
  work.other_params = static_cast<double>(qwen3_weight_bytes(no_layers, DType::kBF16)) / 2;
  work.projection_params =
      static_cast<double>(qwen3_weight_bytes(config, DType::kBF16)) / 2 - work.other_params;
  return work;
}

struct ShapeOptions {
  std::vector<int> batches;
  int context = 1024;
  int prompt = 4096;
  int repeats = 5;
  BenchWeights weights = BenchWeights::kBF16;
};

// A sequence of `length` tokens whose last one is the step's new token.
Sequence bench_sequence(SeqId id, int length, const SamplingParams& params, int vocab) {
  StopChecker stop = StopChecker::create(params, {}, vocab).value();
  return Sequence(id, std::vector<int32_t>(static_cast<size_t>(length), 42), params,
                  std::move(stop), static_cast<uint64_t>(id), std::chrono::steady_clock::now());
}

ForwardLimits bench_limits(const ShapeOptions& options, int max_batch) {
  ForwardLimits limits;
  limits.max_num_tokens = std::max(options.prompt, max_batch);
  limits.max_num_seqs = max_batch;
  limits.max_model_len = std::max(options.prompt, options.context + 1);
  return limits;
}

// Device memory free now (the model placed), and what to keep back from it: the runner's and
// the eager rows' workspaces (allocated after the pool is planned) and room for cuBLAS, the
// split-K workspace, the decode graphs, the sampler and the allocator's granularity.
Result<BenchKvInputs> kv_inputs(Backend& backend, const ModelConfig& config,
                                const ForwardLimits& limits) {
  PDS_ASSIGN_OR_RETURN(const DeviceMemoryInfo info, device_memory_info(backend));
  BenchKvInputs inputs;
  inputs.free_bytes = info.free_bytes;
  const size_t workspace =
      forward_workspace_bytes(config, limits, kBlockSize, backend.activation_dtype());
  inputs.reserve_bytes = 2 * workspace + device_step_input_bytes(limits) +
                         std::max<size_t>(size_t{2} << 30, info.total_bytes / 20);
  return inputs;
}

Status bench_shape(Backend& backend, const std::string& name, const Peaks& peaks,
                   const ShapeOptions& options) {
  PDS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(assets_dir() / name / "config.json"));
  const int asked_max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  PDS_ASSIGN_OR_RETURN(
      std::unique_ptr<Qwen3Model> model,
      Qwen3Model::create(backend, constant_qwen3_weights(config, options.weights)));
  // The KV pool from the memory the model leaves: the batches that fit, the prompt sharing
  // their blocks, and the graphs' scratch block (the pool's last, as the runner expects).
  PDS_ASSIGN_OR_RETURN(BenchKvInputs kv_request,
                       kv_inputs(backend, config, bench_limits(options, asked_max_batch)));
  kv_request.block_bytes = kv_layout_for(config, 1, kBlockSize, DType::kBF16).total_bytes();
  kv_request.block_size = kBlockSize;
  kv_request.context = options.context;
  kv_request.prompt = options.prompt;
  kv_request.batches = options.batches;
  PDS_ASSIGN_OR_RETURN(BenchKvPlan kv_plan, plan_bench_kv(kv_request));
  const int max_batch = *std::max_element(kv_plan.batches.begin(), kv_plan.batches.end());

  // The engine's runner: decode graphs, sampling on the device.
  ModelRunnerConfig runner_config;
  runner_config.block_size = kBlockSize;
  runner_config.kv_dtype = DType::kBF16;
  runner_config.limits = bench_limits(options, max_batch);
  runner_config.num_blocks = kv_plan.num_blocks;
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3ModelRunner> runner,
                       Qwen3ModelRunner::create(backend, *model, runner_config));
  if (runner->schedulable_blocks() != kv_plan.scratch_block) {
    return internal_error(
        "bench: the runner holds back block " + std::to_string(runner->schedulable_blocks()) +
        " as its scratch block, the plan block " + std::to_string(kv_plan.scratch_block));
  }
  const KvLayout& kv_shape = runner->kv_cache().layout();
  // The eager rows' own workspace, over the runner's pool.
  PDS_ASSIGN_OR_RETURN(ForwardContext eager_context,
                       ForwardContext::create(backend, config, runner_config.limits, kBlockSize));

  const double weight_bytes =
      static_cast<double>(qwen3_weight_bytes(bench_config(config, options.weights), DType::kBF16));
  const GemmWork work = gemm_work(config);
  const double kv_token_bytes = static_cast<double>(kv_shape.bytes_per_token());
  std::printf(
      "\n### %s (%s weights %.2f GB, KV %.0f KB/token, pool %d blocks = %.2f GB of "
      "%.2f GB free, %d graphs)\n\n",
      name.c_str(), bench_weights_name(options.weights), weight_bytes / 1e9, kv_token_bytes / 1e3,
      kv_plan.num_blocks, static_cast<double>(kv_shape.total_bytes()) / 1e9,
      static_cast<double>(kv_request.free_bytes) / 1e9, runner->num_decode_graphs());
  std::printf("| step | tokens/s | roofline tokens/s | of roofline | bound |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");

  for (int batch : kv_plan.skipped) {
    std::printf(
        "| decode batch %d, context %d | skipped: its KV does not fit the free memory "
        "| | | |\n",
        batch, options.context);
  }
  const int decode_blocks = kv_plan.decode_blocks_per_seq;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s) {
    tables[static_cast<size_t>(s)].resize(static_cast<size_t>(decode_blocks));
    std::iota(tables[static_cast<size_t>(s)].begin(), tables[static_cast<size_t>(s)].end(),
              s * decode_blocks);
  }
  // The prompt reuses the decode sequences' blocks (their contents do not matter here).
  std::vector<int32_t> prompt_table(static_cast<size_t>(kv_plan.prefill_blocks));
  std::iota(prompt_table.begin(), prompt_table.end(), 0);

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.ignore_eos = true;
  SamplingParams sampled = greedy;  // Qwen3's generation_config.json
  sampled.temperature = 0.6f;
  sampled.top_k = 20;
  sampled.top_p = 0.95f;
  std::vector<Sequence> sequences;
  sequences.reserve(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s) {
    sequences.push_back(bench_sequence(s, options.context + 1, greedy, config.vocab_size));
  }
  std::vector<SamplerRng> rngs(static_cast<size_t>(max_batch), SamplerRng(1));
  std::vector<float> logits(static_cast<size_t>(max_batch) * config.vocab_size);
  std::vector<SampledRow> results(static_cast<size_t>(max_batch));
  const std::vector<std::span<const int32_t>> no_masks(static_cast<size_t>(max_batch));

  // One engine step of `entries` through the runner: launch, sample on the device, one wait.
  const auto runner_step = [&](const ScheduledBatch& batch,
                               std::span<const SamplingRow> rows) -> Status {
    PDS_RETURN_IF_ERROR(runner->launch_step(batch, rows, {}));
    return runner->sample_step(std::span(no_masks).first(rows.size()),
                               std::span(results).first(rows.size()), logits);
  };
  // Every sequence decodes position `context` over `context` cached keys (the KV values are
  // whatever the pool holds; the work does not depend on them).
  const auto decode_rows = [&](const char* how, const SamplingParams* sampling) -> Status {
    for (int batch_size : kv_plan.batches) {
      ScheduledBatch batch;
      std::vector<SamplingRow> rows;
      std::vector<SequenceSlice> slices;
      for (int s = 0; s < batch_size; ++s) {
        Sequence& seq = sequences[static_cast<size_t>(s)];
        ScheduledSequence entry;
        entry.sequence = &seq;
        entry.num_new_tokens = 1;
        entry.num_cached_before = options.context;
        entry.samples = true;
        entry.block_table = tables[static_cast<size_t>(s)];
        batch.entries.push_back(entry);
        slices.push_back({entry.new_tokens(), options.context, entry.block_table});
        if (sampling != nullptr) {
          rows.push_back({sampling,
                          seq.prompt_tokens(),
                          seq.output_tokens(),
                          {},
                          &rngs[static_cast<size_t>(s)]});
        }
      }
      batch.num_decodes = batch.num_samples = batch.num_batched_tokens = batch_size;
      PDS_ASSIGN_OR_RETURN(double step_seconds, time_per_run(backend, options.repeats, [&] {
                             if (sampling == nullptr) {
                               return model->forward(slices, runner->kv_cache(), eager_context,
                                                     logits);
                             }
                             return runner_step(batch, rows);
                           }));
      const double bytes = weight_bytes + batch_size * (options.context + 1.0) * kv_token_bytes;
      const double memory_seconds = bytes / peaks.bytes_per_second;
      const double compute_seconds = work.seconds(batch_size, peaks, options.weights);
      const double bound = std::max(memory_seconds, compute_seconds);
      std::printf("| decode batch %d, context %d, %s | %.0f | %.0f | %.0f%% | %s |\n", batch_size,
                  options.context, how, batch_size / step_seconds, batch_size / bound,
                  100.0 * bound / step_seconds, memory_seconds >= compute_seconds ? "HBM" : "GEMM");
    }
    return {};
  };
  PDS_RETURN_IF_ERROR(decode_rows("runner: graphs + greedy on the GPU", &greedy));
  PDS_RETURN_IF_ERROR(
      decode_rows("runner: graphs + T 0.6, top-k 20, top-p 0.95 on the GPU", &sampled));
  PDS_RETURN_IF_ERROR(decode_rows("eager forward, logits to the host (no sampling)", nullptr));

  Sequence prompt_seq = bench_sequence(max_batch, options.prompt, greedy, config.vocab_size);
  ScheduledBatch prefill;
  ScheduledSequence entry;
  entry.sequence = &prompt_seq;
  entry.num_new_tokens = options.prompt;
  entry.num_cached_before = 0;
  entry.samples = true;
  entry.block_table = prompt_table;
  prefill.entries = {entry};
  prefill.num_samples = 1;
  prefill.num_batched_tokens = options.prompt;
  SamplerRng prefill_rng(1);
  const SamplingRow prefill_row{&greedy, prompt_seq.prompt_tokens(), {}, {}, &prefill_rng};
  PDS_ASSIGN_OR_RETURN(double prefill_seconds, time_per_run(backend, options.repeats, [&] {
                         return runner_step(prefill, {&prefill_row, 1});
                       }));
  const double n = options.prompt;
  const double attention_flops = 4.0 * config.num_hidden_layers * config.num_attention_heads *
                                 config.head_dim * n * n / 2;  // causal QK^T and PV
  const double compute_seconds =
      work.seconds(n, peaks, options.weights) + attention_flops / peaks.bf16_flops_per_second;
  const double memory_seconds = weight_bytes / peaks.bytes_per_second;
  const double bound = std::max(compute_seconds, memory_seconds);
  std::printf("| prefill %d-token prompt, runner | %.0f | %.0f | %.0f%% | %s |\n", options.prompt,
              n / prefill_seconds, n / bound, 100.0 * bound / prefill_seconds,
              compute_seconds >= memory_seconds ? "GEMM" : "HBM");
  return {};
}

int run(int argc, char** argv) {
  ShapeOptions options;
  options.batches = {1, 8, 64, 256};
  std::vector<std::string> shapes = {"qwen3-0.6b", "qwen3-8b"};
  int device_index = 0;
  CLI::App app{
      "pdserve-bench-gpu: CUDA backend decode/prefill throughput against HBM "
      "bandwidth and GEMM peaks (bf16; FP8 with --weights fp8) measured in the same run"};
  app.add_option("--shapes", shapes, "Model shapes under configs/models")->capture_default_str();
  app.add_option("--batches", options.batches, "Decode batch sizes")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--context", options.context, "Cached tokens per decoding sequence")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 17));
  app.add_option("--prompt", options.prompt, "Prefill prompt length")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 17));
  app.add_option("--repeats", options.repeats, "Timed repeats per figure")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  std::string weights = "bf16";
  app.add_option("--weights", weights,
                 "Projection weights: bf16, or fp8 (E4M3 with 128 x 128 block scales, as Qwen's "
                 "-FP8 checkpoints; lm_head stays bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--device-index", device_index, "CUDA device")->capture_default_str();
  if (int code = parse_cli(app, argc, argv); code >= 0) return code;
  options.weights = weights == "fp8" ? BenchWeights::kFp8 : BenchWeights::kBF16;

  BackendOptions backend_options;
  backend_options.device = DeviceKind::kCuda;
  backend_options.device_index = device_index;
  Result<std::unique_ptr<Backend>> backend = create_backend(backend_options);
  if (!backend.ok()) return report_cli_error(backend.status());
  std::printf("# pdserve-bench-gpu on %s\n\n", (*backend)->description().c_str());
  Result<Peaks> peaks = measure_peaks(**backend, options.weights, options.repeats);
  if (!peaks.ok()) return report_cli_error(peaks.status());
  std::printf("| peak | measured |\n| --- | --- |\n");
  std::printf("| HBM bandwidth (1 GiB device copy, read + write) | %.0f GB/s |\n",
              peaks->bytes_per_second / 1e9);
  std::printf("| bf16 GEMM (8192^3, cuBLAS, float accumulation) | %.0f TFLOP/s |\n",
              peaks->bf16_flops_per_second / 1e12);
  if (options.weights == BenchWeights::kFp8) {
    std::printf(
        "| FP8 GEMM (8192^3, bf16 activations quantized per 128, 128 x 128 weight scales) | "
        "%.0f TFLOP/s |\n",
        peaks->fp8_flops_per_second / 1e12);
  }
  for (const std::string& shape : shapes) {
    const Status status = bench_shape(**backend, shape, *peaks, options);
    if (!status.ok()) return report_cli_error(status.with_context(shape));
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::run(argc, argv);
}
