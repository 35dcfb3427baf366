// Shared by the gpu-label test binaries: the backend under test, device-memory helpers and
// main().
//
// Without a CUDA device a binary prints "SKIPPED: no CUDA device" and exits 77 (CTest's skip),
// unless PDSERVE_GPU_TESTS_ON_CPU=1: then the tests run with the CPU backend standing in for
// the device, so that the tests' own logic (inputs, references, tolerances, comparisons) is
// proven on every machine. Tests that only mean something on CUDA (bfloat16 activations,
// CUDA graphs) have "Cuda" in their name; the CPU run filters them out, and they fail if run
// there anyway.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/backend.h"
#include "kernels/cuda_device.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/model/gpu_graph_runner.h"
#endif

namespace pdserve::gpu_test {

constexpr int kSkipExitCode = 77;

// True when the tests run on the CPU backend instead of a device (set by run_main).
inline bool& on_cpu() {
  static bool value = false;
  return value;
}

// The CUDA backend computing in `activation` (bf16 or float32), or on the CPU run the CPU
// backend (float32 only).
inline std::unique_ptr<Backend> backend_under_test(DType activation) {
  BackendOptions options;
  if (on_cpu()) {
    EXPECT_EQ(activation, DType::kF32) << "the CPU run only has float32 activations";
  } else {
    options.device = DeviceKind::kCuda;
    options.activation_dtype = activation;
  }
  Result<std::unique_ptr<Backend>> backend = create_backend(options);
  EXPECT_TRUE(backend.ok()) << backend.status().to_string();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

inline std::unique_ptr<Backend> cpu_reference() {
  return std::move(create_backend(BackendOptions{})).value();
}

// The compiled-in folders, unless the environment names others (a GPU bundle runs these
// binaries on another machine, where run-gpu-tests.sh sets them).
inline std::filesystem::path folder(const char* variable, const char* compiled) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : compiled;
}

// A synthetic bf16 checkpoint of `layers` layers of `config` (a path under the source tree),
// written under the build's test-models folder (a name of `tag` and the process id); the
// caller removes it.
inline std::filesystem::path write_test_model(const std::string& config, const std::string& tag,
                                              int layers, uint64_t seed) {
  SyntheticCheckpointOptions options;
  options.config_path = folder("PDSERVE_SOURCE_DIR", PDSERVE_SOURCE_DIR) / config;
  options.out_dir = folder("PDSERVE_BINARY_DIR", PDSERVE_BINARY_DIR) / "test-models" /
                    (tag + "-" + std::to_string(::getpid()));
  options.seed = seed;
  options.num_layers = layers;
  options.dtype = DType::kBF16;
  options.tokenizer_dir = folder("PDSERVE_ASSETS_DIR", PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  EXPECT_TRUE(written.ok()) << written.status().to_string();
  return options.out_dir;
}

// A checkpoint's model placed on a backend with what its forward needs.
struct PlacedModel {
  std::unique_ptr<Qwen3Model> model;
  ForwardContext context;
  KvCache cache;
};

// The weights read as `weights`, a forward context for `limits` and a pool of `blocks` KV
// blocks of `block_size` tokens in `kv`.
inline PlacedModel place_model(Backend& backend, Checkpoint& checkpoint, DType weights, DType kv,
                               const ForwardLimits& limits, int blocks, int block_size) {
  std::unique_ptr<Qwen3Model> model =
      std::move(Qwen3Model::create(backend, load_qwen3_weights(checkpoint, weights).value()))
          .value();
  const ModelConfig& config = model->config();
  ForwardContext context = ForwardContext::create(backend, config, limits, block_size).value();
  KvCache cache = KvCache::create(backend, kv_layout_for(config, blocks, block_size, kv)).value();
  return {std::move(model), std::move(context), std::move(cache)};
}

// A matrix in the backend's memory, filled from host floats stored as `dtype`.
class DeviceMatrix {
 public:
  DeviceMatrix(Backend& backend, const std::vector<float>& values, DType dtype, int64_t rows,
               int64_t cols)
      : backend_(&backend), dtype_(dtype), rows_(rows), cols_(cols) {
    buffer_ = std::move(backend.allocate(values.size() * dtype_size(dtype))).value();
    std::vector<std::byte> bytes(values.size() * dtype_size(dtype));
    convert_elements(values.data(), DType::kF32, bytes.data(), dtype, values.size());
    EXPECT_TRUE(backend.copy_to_device(buffer_.data(), bytes.data(), bytes.size()).ok());
    EXPECT_TRUE(backend.synchronize().ok());
  }
  // Filled with NaN, so that an element a kernel forgets to write is seen.
  static DeviceMatrix poisoned(Backend& backend, DType dtype, int64_t rows, int64_t cols) {
    return DeviceMatrix(backend,
                        std::vector<float>(static_cast<size_t>(rows * cols), std::nanf("")), dtype,
                        rows, cols);
  }
  MatrixView view() const { return MatrixView::dense(buffer_.data(), dtype_, rows_, cols_); }
  VectorView vector() const { return {buffer_.data(), dtype_, rows_ * cols_}; }
  void* data() const { return buffer_.data(); }
  std::vector<float> download() const {
    std::vector<std::byte> bytes(buffer_.size());
    EXPECT_TRUE(backend_->copy_to_host(bytes.data(), buffer_.data(), bytes.size()).ok());
    std::vector<float> values(static_cast<size_t>(rows_ * cols_));
    convert_elements(bytes.data(), dtype_, values.data(), DType::kF32, values.size());
    return values;
  }

 private:
  Backend* backend_;
  DType dtype_;
  int64_t rows_, cols_;
  DeviceBuffer buffer_;
};

inline DeviceBuffer device_ints(Backend& backend, const std::vector<int32_t>& values) {
  DeviceBuffer buffer =
      std::move(backend.allocate(std::max<size_t>(1, values.size()) * sizeof(int32_t))).value();
  EXPECT_TRUE(
      backend.copy_to_device(buffer.data(), values.data(), values.size() * sizeof(int32_t)).ok());
  EXPECT_TRUE(backend.synchronize().ok());
  return buffer;
}

// Fails a CUDA-only test that the CPU run did not filter out.
#define PDS_REQUIRE_CUDA()                                                                \
  do {                                                                                    \
    if (::pdserve::gpu_test::on_cpu()) FAIL() << "needs the CUDA device (filter it out)"; \
  } while (0)

#ifdef PDSERVE_WITH_CUDA
// `steps` decode steps of one token per sequence (token step * 7 + s + 1), each run eagerly by
// `model` on its own pool and replayed by `runner`; compare(step) then judges `graph` against
// `eager` (the steps' logits). `cached` holds each sequence's length and is advanced.
template <typename Compare>
void decode_eager_and_replayed(Qwen3Model& model, KvCache& eager_cache,
                               ForwardContext& eager_context, DecodeGraphRunner& runner,
                               const std::vector<std::vector<int32_t>>& tables,
                               std::vector<int>& cached, int steps, std::vector<float>& eager,
                               std::vector<float>& graph, Compare&& compare) {
  const size_t num_seqs = tables.size();
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int32_t>> tokens(num_seqs);
    std::vector<SequenceSlice> decode;
    for (size_t s = 0; s < num_seqs; ++s) {
      tokens[s] = {static_cast<int32_t>(step * 7 + static_cast<int>(s) + 1)};
      decode.push_back({tokens[s], cached[s], tables[s]});
    }
    ASSERT_TRUE(model.forward(decode, eager_cache, eager_context, eager).ok());
    const Status status = runner.forward(decode, graph);
    ASSERT_TRUE(status.ok()) << status.to_string();
    compare(step);
    for (int& c : cached) ++c;
  }
}
#endif

// Whether a binary's tests can run with the CPU backend standing in for the device (those
// written against backend_under_test); the others always skip without a device.
enum class CpuStandIn { kAllowed, kNever };

inline int run_main(int argc, char** argv, CpuStandIn stand_in = CpuStandIn::kAllowed) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  const Result<int> devices = cuda_device_count();
  if (!devices.ok()) {
    const char* on_cpu_flag = std::getenv("PDSERVE_GPU_TESTS_ON_CPU");
    if (stand_in == CpuStandIn::kAllowed && on_cpu_flag != nullptr &&
        std::string(on_cpu_flag) == "1") {
      std::fprintf(stderr,
                   "no CUDA device (%s): running on the CPU backend "
                   "(PDSERVE_GPU_TESTS_ON_CPU=1)\n",
                   devices.status().to_string().c_str());
      on_cpu() = true;
      return RUN_ALL_TESTS();
    }
    std::fprintf(stderr,
                 "\n**********************************************************************\n"
                 "SKIPPED: no CUDA device (%s)\n"
                 "**********************************************************************\n\n",
                 devices.status().to_string().c_str());
    return kSkipExitCode;
  }
  return RUN_ALL_TESTS();
}

}  // namespace pdserve::gpu_test
