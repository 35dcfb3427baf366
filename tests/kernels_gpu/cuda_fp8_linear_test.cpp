// The CUDA FP8 linear layer (issue #31 item 3) on a device: its kernels bit for bit against
// their host specifications (activation quantization, tile scales), and both GEMM paths
// against float64 references computed here from the dequantized weights (scale x e4m3 value,
// the representation's rule), per row (kernel_check.h):
// - the block-scaled cuBLASLt path (compute capability 9.0) against the reference on the
//   activations as the kernel quantized them: only float32 accumulation and the bf16 output
//   differ (<= 5e-3); and against the unquantized bf16 activations, which adds e4m3's rounding
//   of each activation (relative 2^-4 at most; 2.9% worst row in a numpy simulation of these
//   shapes and distributions: <= 4e-2);
// - the dequantize path (any device) against the unquantized activations: only the weight's
//   rounding to bf16 when expanded and the output's differ (<= 1e-2).
// Block scales vary from 2^-12 to 2^-4 and activation rows by 1e-3..1e3, so a scale applied to
// the wrong block or row fails by orders of magnitude. Then a whole 2-layer FP8 model of the
// 0.6B shape placed on CUDA (1 byte a weight on the device) against the CPU's FP8 model. No
// CPU stand-in: without a device the binary skips (exit 77).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/float8.h"
#include "kernels/fp8_activation_quant.h"
#include "kernels/fp8_cuda_kernels.h"
#include "kernels/fp8_linear_plan.h"
#include "kernels/linear_fp8_cuda.h"
#include "tests/kernels_gpu/gpu_test_main.h"
#include "tests/kernels_gpu/kernel_check.h"

namespace pdserve {
namespace {

using kernel_check::row_errors;
using kernel_check::RowErrors;

// Device memory freed at scope exit.
struct DeviceMemory {
  void* data = nullptr;
  explicit DeviceMemory(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceMemory() { cudaFree(data); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

template <typename T>
std::unique_ptr<DeviceMemory> upload(const std::vector<T>& host) {
  auto memory = std::make_unique<DeviceMemory>(host.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(memory->data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return memory;
}

template <typename T>
std::vector<T> download(const DeviceMemory& memory, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), memory.data, count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

struct Fixture {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::unique_ptr<DeviceMemory> lt_workspace = std::make_unique<DeviceMemory>(size_t{32} << 20);
  Fp8Device device;

  Fixture() {
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    EXPECT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasSetStream(cublas, stream), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasSetWorkspace(cublas, lt_workspace->data, size_t{32} << 20),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    cudaDeviceProp properties{};
    EXPECT_EQ(cudaGetDeviceProperties(&properties, 0), cudaSuccess);
    device = {properties.major, properties.minor, cublasLtGetVersion()};
  }
  ~Fixture() {
    cublasLtDestroy(lt);
    cublasDestroy(cublas);
    cudaStreamDestroy(stream);
  }
  CudaFp8Context context() const {
    return {cublas, lt, stream, lt_workspace->data, size_t{32} << 20};
  }
};

// An n x k FP8 weight with 128x128 block scales 2^-12..2^-4, its codes never NaN.
struct HostWeight {
  Fp8WeightShape shape;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> dequantized;  // the representation's value of each element
};

HostWeight make_weight(int64_t n, int64_t k, uint64_t seed) {
  HostWeight w;
  w.shape = {n, k, 128, 128};
  const std::vector<float> values = kernel_check::uniform_floats(static_cast<size_t>(n * k), seed);
  w.codes.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    w.codes[i] = float_to_fp8_e4m3_saturated(values[i] * 448.0f);
  }
  const int64_t scale_cols = (k + 127) / 128;
  const int64_t scale_rows = (n + 127) / 128;
  for (int64_t b = 0; b < scale_rows * scale_cols; ++b) {
    w.scales.push_back(std::ldexp(1.0f, -12 + static_cast<int>(b * 7 % 9)));
  }
  w.dequantized.resize(values.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      w.dequantized[i * k + j] =
          fp8_e4m3_to_float(w.codes[i * k + j]) * w.scales[(i / 128) * scale_cols + j / 128];
    }
  }
  return w;
}

// m x k activations as bf16 gives them, rows scaled 1e-3..1e3.
std::vector<float> make_activations(int64_t m, int64_t k, uint64_t seed) {
  std::vector<float> x = kernel_check::uniform_floats(static_cast<size_t>(m * k), seed);
  for (int64_t r = 0; r < m; ++r) {
    const float scale = std::pow(10.0f, static_cast<float>(r % 7) - 3.0f);
    for (int64_t j = 0; j < k; ++j) x[r * k + j] *= scale;
  }
  return kernel_check::rounded_to(std::move(x), DType::kBF16);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return bits;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& bits) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

std::vector<int64_t> all_rows(int64_t m) {
  std::vector<int64_t> rows(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) rows[static_cast<size_t>(r)] = r;
  return rows;
}

// Runs the FP8 linear layer by `path` on bf16 activations; returns the bf16 output as floats.
std::vector<float> run_linear(Fixture& fixture, Fp8GemmPath path, const HostWeight& weight,
                              const std::vector<float>& x, int64_t m) {
  const int64_t n = weight.shape.n;
  const int64_t k = weight.shape.k;
  auto codes = upload(weight.codes);
  auto scales = upload(weight.scales);
  auto in = upload(to_bf16(x));
  std::vector<uint16_t> poison(static_cast<size_t>(m * n), 0x7fc0);  // bf16 NaN
  auto out = upload(poison);
  const Fp8Workspace plan = plan_fp8_workspace(path, weight.shape, m, DType::kBF16);
  DeviceMemory workspace(plan.bytes);
  const Fp8WeightView view{codes->data, k, weight.shape, scales->as<float>()};
  const Status status =
      linear_fp8_cuda(fixture.context(), path, MatrixView::dense(in->data, DType::kBF16, m, k),
                      view, MatrixView::dense(out->data, DType::kBF16, m, n), workspace.data);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(cudaStreamSynchronize(fixture.stream), cudaSuccess);
  return from_bf16(download<uint16_t>(*out, static_cast<size_t>(m * n)));
}

TEST(CudaFp8Kernels, ActivationQuantizationEqualsTheHostReferenceBitForBit) {
  Fixture fixture;
  for (const int64_t k : {int64_t{640}, int64_t{100}, int64_t{4096}}) {
    const int64_t m = 37;
    const int64_t stride = k + 8;  // a column slice's stride
    std::vector<float> x(static_cast<size_t>(m * stride), 0.0f);
    const std::vector<float> values = make_activations(m, k, 11);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < k; ++j) x[r * stride + j] = values[r * k + j];
    }
    x[5 * stride + 3] = 0.0f;  // and a group with one huge element
    x[6 * stride + 7] = 3e4f;
    const int64_t groups = (k + 127) / 128;
    std::vector<uint8_t> want_q(static_cast<size_t>(m * k));
    std::vector<float> want_scales(static_cast<size_t>(groups * m));
    quantize_fp8_token_groups_reference(x.data(), m, k, stride, want_q.data(), want_scales.data());
    for (const DType dtype : {DType::kBF16, DType::kF32}) {
      std::unique_ptr<DeviceMemory> in = dtype == DType::kBF16 ? upload(to_bf16(x)) : upload(x);
      DeviceMemory q(want_q.size());
      DeviceMemory scales(want_scales.size() * sizeof(float));
      ASSERT_EQ(cuda::quantize_fp8_token_groups({in->data, dtype, m, k, stride}, q.as<uint8_t>(),
                                                scales.as<float>(), fixture.stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(fixture.stream), cudaSuccess);
      EXPECT_EQ(download<uint8_t>(q, want_q.size()), want_q) << "k " << k;
      const std::vector<float> got = download<float>(scales, want_scales.size());
      EXPECT_EQ(std::memcmp(got.data(), want_scales.data(), got.size() * sizeof(float)), 0)
          << "k " << k;
    }
  }
}

TEST(CudaFp8Kernels, TileScalesEqualTheHostLayout) {
  Fixture fixture;
  for (const Fp8WeightShape shape :
       {Fp8WeightShape{300, 520, 128, 128}, Fp8WeightShape{6144, 4096, 128, 128},
        Fp8WeightShape{384, 640, 384, 640}}) {
    const int64_t count = ((shape.n + shape.scale_block_n - 1) / shape.scale_block_n) *
                          ((shape.k + shape.scale_block_k - 1) / shape.scale_block_k);
    std::vector<float> scales(static_cast<size_t>(count));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.25f + static_cast<float>(i);
    const std::vector<float> want = fp8_tile_scales(shape, scales.data());
    auto source = upload(scales);
    DeviceMemory grid(want.size() * sizeof(float));
    ASSERT_EQ(cuda::fp8_tile_scales(source->as<float>(), shape.n, shape.k, shape.scale_block_n,
                                    shape.scale_block_k, grid.as<float>(),
                                    fp8_tile_scale_stride(shape.k), fixture.stream),
              cudaSuccess);
    EXPECT_EQ(download<float>(grid, want.size()), want) << shape.n << "x" << shape.k;
  }
}

TEST(CudaFp8Linear, DequantizePathMatchesTheFloat64Reference) {
  Fixture fixture;
  for (const auto& [n, k, m] :
       {std::tuple<int64_t, int64_t, int64_t>{384, 640, 37}, {6144, 4096, 1}, {6144, 4096, 256}}) {
    const HostWeight weight = make_weight(n, k, 3);
    const std::vector<float> x = make_activations(m, k, 5);
    const std::vector<float> out = run_linear(fixture, Fp8GemmPath::kDequantize, weight, x, m);
    const std::vector<double> want =
        kernel_check::reference_linear(x, weight.dequantized, n, k, all_rows(m));
    const RowErrors errors = row_errors(out, want, m, n);
    EXPECT_TRUE(errors.within(1e-2)) << n << "x" << k << " m " << m << ": " << errors.describe();
  }
}

TEST(CudaFp8Linear, BlockScaledPathMatchesTheFloat64Reference) {
  Fixture fixture;
  const Fp8WeightShape probe{6144, 4096, 128, 128};
  const Fp8GemmChoice choice =
      choose_fp8_gemm_path(probe, fixture.device, DType::kBF16, DType::kBF16);
  if (choice.path != Fp8GemmPath::kBlockScaledLt) GTEST_SKIP() << choice.reason;
  for (const auto& [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{384, 640, 37},
                                {6144, 4096, 1},
                                {6144, 4096, 256},
                                {4096, 12288, 8}}) {
    const HostWeight weight = make_weight(n, k, 7);
    const std::vector<float> x = make_activations(m, k, 9);
    const std::vector<float> out = run_linear(fixture, Fp8GemmPath::kBlockScaledLt, weight, x, m);
    // The activations as the kernel quantized them (bit for bit: the test above).
    const int64_t groups = (k + 127) / 128;
    std::vector<uint8_t> q(static_cast<size_t>(m * k));
    std::vector<float> scales(static_cast<size_t>(groups * m));
    quantize_fp8_token_groups_reference(x.data(), m, k, k, q.data(), scales.data());
    std::vector<float> x_quantized(q.size());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        x_quantized[r * k + j] = fp8_e4m3_to_float(q[r * k + j]) * scales[(j / 128) * m + r];
      }
    }
    const RowErrors exact = row_errors(
        out, kernel_check::reference_linear(x_quantized, weight.dequantized, n, k, all_rows(m)), m,
        n);
    EXPECT_TRUE(exact.within(5e-3))
        << n << "x" << k << " m " << m << " vs quantized input: " << exact.describe();
    const RowErrors unquantized = row_errors(
        out, kernel_check::reference_linear(x, weight.dequantized, n, k, all_rows(m)), m, n);
    EXPECT_TRUE(unquantized.within(4e-2))
        << n << "x" << k << " m " << m << " vs bf16 input: " << unquantized.describe();
  }
}

// A synthetic FP8 checkpoint (2 layers of the 0.6B shape, pdserve-make-model's FP8 writer),
// prefill of 200 tokens then 16 greedy decode steps teacher-forced with the CPU's tokens: the
// CUDA FP8 model's logits within 1e-1 of the CPU FP8 model's (float32 activations, the codes
// decoded exactly; per-row relative: on 9.0 the activation quantization adds e4m3's ~3% per
// projection, bf16 activations ~0.5%: a derived bound, to be replaced by the first GPU run's
// figure), and the same greedy token wherever the CPU's top-2 margin exceeds half the logits'
// RMS (five times the mean element error that bound allows).
TEST(CudaFp8Model, GreedyTokensMatchTheCpuFp8Model) {
  SyntheticCheckpointOptions options;
  options.config_path = gpu_test::folder("PDSERVE_SOURCE_DIR", PDSERVE_SOURCE_DIR) /
                        "configs/models/qwen3-0.6b/config.json";
  options.out_dir = gpu_test::folder("PDSERVE_BINARY_DIR", PDSERVE_BINARY_DIR) / "test-models" /
                    ("cuda-fp8-" + std::to_string(::getpid()));
  options.seed = 5;
  options.num_layers = 2;
  options.dtype = DType::kBF16;
  options.fp8 = true;  // Qwen's "-FP8" layout: 128x128 blocks, bf16 weight_scale_inv
  options.tokenizer_dir =
      gpu_test::folder("PDSERVE_ASSETS_DIR", PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  const std::filesystem::path dir = options.out_dir;
  Checkpoint checkpoint = Checkpoint::open(dir).value();
  // The projections stay FP8 in both; the rest in each backend's compute dtype.
  Qwen3Weights fp8 = load_qwen3_weights(checkpoint, DType::kBF16).value();
  Qwen3Weights reference = load_qwen3_weights(checkpoint, DType::kF32).value();
  ASSERT_EQ(fp8.layers[0].q_proj.dtype, DType::kF8E4M3);
  BackendOptions cuda_options;
  cuda_options.device = DeviceKind::kCuda;
  std::unique_ptr<Backend> cuda = std::move(create_backend(cuda_options)).value();
  std::unique_ptr<Backend> cpu = std::move(create_backend(BackendOptions{})).value();
  ForwardLimits limits;
  limits.max_num_tokens = 256;
  limits.max_num_seqs = 4;
  limits.max_model_len = 512;
  const ModelConfig config = reference.config;
  const auto place = [&](Backend& backend, Qwen3Weights weights, DType kv) {
    Result<std::unique_ptr<Qwen3Model>> model = Qwen3Model::create(backend, std::move(weights));
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    ForwardContext context = ForwardContext::create(backend, config, limits, 16).value();
    KvCache cache = KvCache::create(backend, kv_layout_for(config, 40, 16, kv)).value();
    return gpu_test::PlacedModel{std::move(model).value(), std::move(context), std::move(cache)};
  };
  gpu_test::PlacedModel on_cuda = place(*cuda, std::move(fp8), DType::kBF16);
  gpu_test::PlacedModel on_cpu = place(*cpu, std::move(reference), DType::kF32);

  std::vector<int32_t> table(32);
  std::iota(table.begin(), table.end(), 3);
  std::vector<int32_t> input(200);
  std::mt19937 rng(9);
  for (int32_t& id : input) id = static_cast<int32_t>(rng() % config.vocab_size);
  const auto vocab = static_cast<size_t>(config.vocab_size);
  std::vector<float> cuda_logits(vocab), cpu_logits(vocab);
  int cached = 0;
  int agreed = 0;
  double worst = 0.0;
  for (int step = 0; step <= 16; ++step) {
    const SequenceSlice slice{input, cached, table};
    ASSERT_TRUE(on_cpu.model->forward({&slice, 1}, on_cpu.cache, on_cpu.context, cpu_logits).ok());
    const Status status =
        on_cuda.model->forward({&slice, 1}, on_cuda.cache, on_cuda.context, cuda_logits);
    ASSERT_TRUE(status.ok()) << status.to_string();
    const RowErrors errors = row_errors(cuda_logits, cpu_logits, 1, static_cast<int64_t>(vocab));
    worst = std::max(worst, errors.worst);
    EXPECT_TRUE(errors.within(1e-1)) << "step " << step << ": " << errors.describe();
    std::vector<size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](size_t a, size_t b) { return cpu_logits[a] > cpu_logits[b]; });
    double rms = 0.0;
    for (float l : cpu_logits) rms += static_cast<double>(l) * l;
    rms = std::sqrt(rms / static_cast<double>(vocab));
    const auto cuda_top = static_cast<size_t>(
        std::max_element(cuda_logits.begin(), cuda_logits.end()) - cuda_logits.begin());
    if (cpu_logits[order[0]] - cpu_logits[order[1]] > 0.5 * rms) {
      EXPECT_EQ(cuda_top, order[0]) << "step " << step;
      ++agreed;
    }
    cached += static_cast<int>(input.size());
    input = {static_cast<int32_t>(order[0])};
  }
  std::printf(
      "  FP8 logits' worst relative error %.3g; greedy compared with a clear margin: %d "
      "of 17\n",
      worst, agreed);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv, pdserve::gpu_test::CpuStandIn::kNever);
}
