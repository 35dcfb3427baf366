// pdserve-bench-gpu: the CUDA backend against its own rooflines, measured in the same run.
// First the device's HBM bandwidth (device-to-device copy) and bf16 GEMM peak (the backend's
// linear at 8192^3); then, for Qwen3 shapes with constant weights (throughput does not
// depend on their values), decode tokens/s at several batch sizes over 1k-token contexts and
// prefill tokens/s of one 4k prompt, each beside the bound those two peaks put on it. The KV
// pool is sized from the memory left free once the model is placed (bench_kv_plan.h); a batch
// size that does not fit is reported as skipped.
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
#include "common/core/cli.h"
#include "common/core/dtype.h"
#include "common/model/model_config.h"
#include "common/model/qwen3_weights.h"
#include "kernels/backend.h"
#include "kernels/model/gpu_memory_plan.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/model/gpu_graph_runner.h"
#endif
#include "kernels/model/kv_cache.h"
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
  double flops_per_second = 0;
};

Result<Peaks> measure_peaks(Backend& backend, int repeats) {
  Peaks peaks;
  const size_t bytes = size_t{1} << 30;
  PDS_ASSIGN_OR_RETURN(DeviceBuffer source, backend.allocate(bytes));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer target, backend.allocate(bytes));
  PDS_ASSIGN_OR_RETURN(double copy_seconds, time_per_run(backend, repeats, [&] {
                         return backend.copy_to_device(target.data(), source.data(), bytes);
                       }));
  peaks.bytes_per_second = 2.0 * static_cast<double>(bytes) / copy_seconds;  // read + write

  const int64_t n = 8192;
  const size_t matrix_bytes = static_cast<size_t>(n * n) * dtype_size(DType::kBF16);
  const std::vector<uint16_t> ones(static_cast<size_t>(n * n), float_to_bf16(0.01f));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer a, backend.allocate(matrix_bytes));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer b, backend.allocate(matrix_bytes));
  PDS_ASSIGN_OR_RETURN(DeviceBuffer c, backend.allocate(matrix_bytes));
  PDS_RETURN_IF_ERROR(backend.copy_to_device(a.data(), ones.data(), matrix_bytes));
  PDS_RETURN_IF_ERROR(backend.copy_to_device(b.data(), ones.data(), matrix_bytes));
  const auto view = [&](const DeviceBuffer& buffer) {
    return MatrixView::dense(buffer.data(), DType::kBF16, n, n);
  };
  PDS_ASSIGN_OR_RETURN(double gemm_seconds, time_per_run(backend, repeats, [&] {
                         return backend.linear(view(a), view(b), view(c));
                       }));
  peaks.flops_per_second = 2.0 * static_cast<double>(n * n * n) / gemm_seconds;
  return peaks;
}

// Constant-valued weights of the config's shapes: projections 0.01, norms 1.
Qwen3Weights constant_weights(const ModelConfig& config) {
  const auto hidden = static_cast<int64_t>(config.hidden_size);
  const auto inter = static_cast<int64_t>(config.intermediate_size);
  const int64_t q_width = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_width = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t largest =
      std::max({int64_t{config.vocab_size} * hidden, inter * hidden, q_width * hidden});
  auto small =
      std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(largest), float_to_bf16(0.01f));
  auto ones = std::make_shared<std::vector<uint16_t>>(
      static_cast<size_t>(std::max<int64_t>(hidden, config.head_dim)), float_to_bf16(1.0f));
  const auto tensor = [](const std::shared_ptr<std::vector<uint16_t>>& data,
                         std::vector<int64_t> shape) {
    HostTensor t;
    t.dtype = DType::kBF16;
    t.shape = std::move(shape);
    t.data = reinterpret_cast<const std::byte*>(data->data());
    t.keep_alive = data;
    return t;
  };
  Qwen3Weights w;
  w.config = config;
  w.embed_tokens = tensor(small, {config.vocab_size, hidden});
  w.final_norm = tensor(ones, {hidden});
  // A distinct buffer for an untied lm_head, so the model keeps two device copies as a real
  // untied checkpoint does.
  w.lm_head =
      config.tie_word_embeddings
          ? w.embed_tokens
          : tensor(std::make_shared<std::vector<uint16_t>>(
                       static_cast<size_t>(config.vocab_size * hidden), float_to_bf16(0.01f)),
                   {config.vocab_size, hidden});
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    Qwen3LayerWeights layer;
    layer.input_layernorm = tensor(ones, {hidden});
    layer.post_attention_layernorm = tensor(ones, {hidden});
    layer.q_norm = tensor(ones, {config.head_dim});
    layer.k_norm = tensor(ones, {config.head_dim});
    layer.q_proj = tensor(small, {q_width, hidden});
    layer.k_proj = tensor(small, {kv_width, hidden});
    layer.v_proj = tensor(small, {kv_width, hidden});
    layer.o_proj = tensor(small, {hidden, q_width});
    layer.gate_proj = tensor(small, {inter, hidden});
    layer.up_proj = tensor(small, {inter, hidden});
    layer.down_proj = tensor(small, {hidden, inter});
    w.layers.push_back(std::move(layer));
  }
  return w;
}

struct ShapeOptions {
  std::vector<int> batches;
  int context = 1024;
  int prompt = 4096;
  int repeats = 5;
};

// Device memory free now (the model and workspace placed), and what to keep back from it.
Result<BenchKvInputs> kv_inputs(Backend& backend) {
  BenchKvInputs inputs;
#ifdef PDSERVE_WITH_CUDA
  PDS_ASSIGN_OR_RETURN(CudaMemoryInfo info, cuda_memory_info(backend));
  inputs.free_bytes = info.free_bytes;
  // cuBLAS, the split-K workspace, graph pools and the allocator's granularity.
  inputs.reserve_bytes = std::max<size_t>(size_t{2} << 30, info.total_bytes / 20);
#else
  static_cast<void>(backend);
#endif
  return inputs;
}

Status bench_shape(Backend& backend, const std::string& name, const Peaks& peaks,
                   const ShapeOptions& options) {
  PDS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(assets_dir() / name / "config.json"));
  const int asked_max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model,
                       Qwen3Model::create(backend, constant_weights(config)));
  ForwardLimits limits;
  limits.max_num_tokens = std::max(options.prompt, asked_max_batch);
  limits.max_num_seqs = asked_max_batch;
  limits.max_model_len = std::max(options.prompt, options.context + 1);
  PDS_ASSIGN_OR_RETURN(ForwardContext context,
                       ForwardContext::create(backend, config, limits, kBlockSize));
  PDS_ASSIGN_OR_RETURN(BenchKvInputs kv_request, kv_inputs(backend));
  kv_request.block_bytes = kv_layout_for(config, 1, kBlockSize, DType::kBF16).total_bytes();
  kv_request.block_size = kBlockSize;
  kv_request.context = options.context;
  kv_request.prompt = options.prompt;
  kv_request.batches = options.batches;
  PDS_ASSIGN_OR_RETURN(BenchKvPlan kv_plan, plan_bench_kv(kv_request));
  const KvLayout kv_shape = kv_layout_for(config, kv_plan.num_blocks, kBlockSize, DType::kBF16);
  PDS_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(backend, kv_shape));
  const int max_batch = *std::max_element(kv_plan.batches.begin(), kv_plan.batches.end());

  const double weight_bytes = static_cast<double>(qwen3_weight_bytes(config, DType::kBF16));
  const double params = weight_bytes / 2;
  const double kv_token_bytes = static_cast<double>(kv_shape.bytes_per_token());
  std::printf(
      "\n### %s (bf16 weights %.2f GB, KV %.0f KB/token, pool %d blocks = %.2f GB of "
      "%.2f GB free)\n\n",
      name.c_str(), weight_bytes / 1e9, kv_token_bytes / 1e3, kv_plan.num_blocks,
      static_cast<double>(kv_shape.total_bytes()) / 1e9,
      static_cast<double>(kv_request.free_bytes) / 1e9);
  std::printf("| step | tokens/s | roofline tokens/s | of roofline | bound |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");

  for (int batch : kv_plan.skipped) {
    std::printf(
        "| decode batch %d, context %d | skipped: its KV does not fit the free memory "
        "| | | |\n",
        batch, options.context);
  }
  const int blocks_per_seq = kv_plan.decode_blocks_per_seq;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s) {
    tables[static_cast<size_t>(s)].resize(static_cast<size_t>(blocks_per_seq));
    std::iota(tables[static_cast<size_t>(s)].begin(), tables[static_cast<size_t>(s)].end(),
              s * blocks_per_seq);
  }
  const std::vector<int32_t> token = {42};
  std::vector<float> logits(static_cast<size_t>(max_batch) * config.vocab_size);
  // Every sequence decodes position `context` over `context` cached keys (the KV values are
  // whatever the pool holds; the work does not depend on them).
  const auto decode_rows = [&](const char* how, const auto& step) -> Status {
    for (int batch : kv_plan.batches) {
      std::vector<SequenceSlice> slices;
      for (int s = 0; s < batch; ++s) slices.push_back({token, options.context, tables[s]});
      PDS_ASSIGN_OR_RETURN(double step_seconds, time_per_run(backend, options.repeats, [&] {
                             return step(std::span<const SequenceSlice>(slices));
                           }));
      const double bytes = weight_bytes + batch * (options.context + 1.0) * kv_token_bytes;
      const double memory_seconds = bytes / peaks.bytes_per_second;
      const double compute_seconds = 2.0 * params * batch / peaks.flops_per_second;
      const double bound = std::max(memory_seconds, compute_seconds);
      std::printf("| decode batch %d, context %d, %s | %.0f | %.0f | %.0f%% | %s |\n", batch,
                  options.context, how, batch / step_seconds, batch / bound,
                  100.0 * bound / step_seconds, memory_seconds >= compute_seconds ? "HBM" : "GEMM");
    }
    return {};
  };
  PDS_RETURN_IF_ERROR(decode_rows("eager", [&](std::span<const SequenceSlice> slices) {
    return model->forward(slices, cache, context, logits);
  }));
#ifdef PDSERVE_WITH_CUDA
  PDS_ASSIGN_OR_RETURN(
      std::unique_ptr<DecodeGraphRunner> graphs,
      DecodeGraphRunner::create(backend, *model, cache, context, kv_plan.scratch_block));
  PDS_RETURN_IF_ERROR(decode_rows("CUDA graphs", [&](std::span<const SequenceSlice> slices) {
    return graphs->forward(slices, logits);
  }));
#endif

  // The prompt reuses the decode sequences' blocks (their contents do not matter here).
  std::vector<int32_t> prefill_table(static_cast<size_t>(kv_plan.prefill_blocks));
  std::iota(prefill_table.begin(), prefill_table.end(), 0);
  std::vector<int32_t> prompt(static_cast<size_t>(options.prompt), 42);
  const SequenceSlice prefill{prompt, 0, prefill_table};
  PDS_ASSIGN_OR_RETURN(double prefill_seconds, time_per_run(backend, options.repeats, [&] {
                         return model->forward({&prefill, 1}, cache, context, logits);
                       }));
  const double n = options.prompt;
  const double attention_flops = 4.0 * config.num_hidden_layers * config.num_attention_heads *
                                 config.head_dim * n * n / 2;  // causal QK^T and PV
  const double compute_seconds = (2.0 * params * n + attention_flops) / peaks.flops_per_second;
  const double memory_seconds = weight_bytes / peaks.bytes_per_second;
  const double bound = std::max(compute_seconds, memory_seconds);
  std::printf("| prefill %d-token prompt | %.0f | %.0f | %.0f%% | %s |\n", options.prompt,
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
      "bandwidth and bf16 GEMM peak measured in the same run"};
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
  app.add_option("--device-index", device_index, "CUDA device")->capture_default_str();
  if (int code = parse_cli(app, argc, argv); code >= 0) return code;

  BackendOptions backend_options;
  backend_options.device = DeviceKind::kCuda;
  backend_options.device_index = device_index;
  Result<std::unique_ptr<Backend>> backend = create_backend(backend_options);
  if (!backend.ok()) return report_cli_error(backend.status());
  std::printf("# pdserve-bench-gpu on %s\n\n", (*backend)->description().c_str());
  Result<Peaks> peaks = measure_peaks(**backend, options.repeats);
  if (!peaks.ok()) return report_cli_error(peaks.status());
  std::printf("| peak | measured |\n| --- | --- |\n");
  std::printf("| HBM bandwidth (1 GiB device copy, read + write) | %.0f GB/s |\n",
              peaks->bytes_per_second / 1e9);
  std::printf("| bf16 GEMM (8192^3, cuBLAS, float accumulation) | %.0f TFLOP/s |\n",
              peaks->flops_per_second / 1e12);
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
