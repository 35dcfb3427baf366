// The device half of Qwen3ModelRunner on a backend that does not share host memory (CUDA):
// decode steps through CUDA graphs (gpu_graph_runner.h), sampling on the device
// (sampling_cuda.cu), the step's inputs up in one copy from page-locked memory and one wait per
// step. No CUDA types here, so the runner compiles in CPU-only builds, where
// make_cuda_step_path answers Unimplemented.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/core/status.h"
#include "common/engine/model_executor.h"
#include "kernels/backend.h"
#include "kernels/model/forward_batch.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

class DeviceStepPath {
 public:
  virtual ~DeviceStepPath() = default;

  // Prepares the slices' batch (padded to a decode graph when one holds it), packs the
  // sampling rows behind it (drawing their u; row i samples logits row logits_rows[i], the
  // index of its slice), sends both up in one copy and queues the step. Waits for nothing.
  virtual Status launch(std::span<const SequenceSlice> slices, std::span<const SamplingRow> rows,
                        std::span<const int32_t> logits_rows) = 0;
  // After launch(): uploads the grammar masks (when a row has one), queues the raw logits rows
  // the host needs (logprobs, rows left to the host), the sampling kernel and the tokens' copy
  // back, waits once, and fills `results` and those rows of `logits` (ModelExecutor's
  // sample_step contract).
  virtual Status sample(std::span<const std::span<const int32_t>> allowed,
                        std::span<SampledRow> results, std::span<float> logits) = 0;
  // The slices' logits to host memory, decode steps through the graphs (Qwen3Model::forward's
  // contract).
  virtual Status forward(std::span<const SequenceSlice> slices, std::span<float> logits) = 0;
  virtual int num_graphs() const = 0;
};

// `scratch_block`: a pool block no sequence is ever given (padding sequences of the graphs
// write there); -1 when cuda_graphs is false. `context` must have been created with
// device_step_input_bytes(...) extra input bytes. Everything given must outlive the path.
Result<std::unique_ptr<DeviceStepPath>> make_cuda_step_path(Backend& backend, Qwen3Model& model,
                                                            KvCache& cache, ForwardContext& context,
                                                            int scratch_block, bool cuda_graphs);

// The extra step-input bytes a step path packs behind the batch (its sampling rows and lists).
size_t device_step_input_bytes(const ForwardLimits& limits);

struct DeviceMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
// The device's free and total memory (cudaMemGetInfo); Unimplemented on other backends.
Result<DeviceMemoryInfo> device_memory_info(Backend& backend);

}  // namespace pdserve
