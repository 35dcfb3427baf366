// The engine's ModelExecutor for a Qwen3Model on any backend: owns the paged KV pool and the
// forward workspace, turns scheduled entries into SequenceSlices and returns the logits rows
// of the entries that sample. (A whole serving engine is assembled in serving/engine_assembly.h.)
//
// On CUDA it is the product's fast path (device_step_path.h): decode steps replay CUDA graphs
// (one per batch and context bucket, captured at creation), tokens are sampled on the device
// (samples_on_device(): the engine calls launch_step/sample_step), the step's inputs go up in
// one copy and the host waits once per step. The graphs need a KV block no sequence owns: the
// pool's last block is held back, so the scheduler must be given schedulable_blocks(), not the
// pool's size. The pool can be sized from the device's free memory
// (ModelRunnerConfig::gpu_memory_utilization, measured after a profiling step).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/engine/model_executor.h"
#include "kernels/model/device_step_path.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

struct ModelRunnerConfig {
  // The KV pool's blocks (on CUDA one of them is the graphs' scratch block). Ignored when
  // gpu_memory_utilization is set.
  int num_blocks = 0;
  int block_size = 16;
  DType kv_dtype = DType::kF32;
  KvScales kv_scales;    // an FP8 pool's per-layer scales (empty: 1.0)
  ForwardLimits limits;  // max_num_tokens = the scheduler's max_num_batched_tokens, etc.
  // CUDA only: the pool takes what this fraction of the device's total memory leaves once the
  // weights, the workspace, the graphs and a profiling step at limits.max_num_tokens are in
  // place (vLLM's --gpu-memory-utilization). InvalidArgument on the CPU.
  std::optional<double> gpu_memory_utilization;
  // With gpu_memory_utilization: what a draft model will take besides (gpu_memory_plan.h).
  DraftMemory draft;
  // CUDA only: decode steps through CUDA graphs (false: every step eager, for comparisons).
  bool cuda_graphs = true;
};

// How a CUDA runner sized its pool from gpu_memory_utilization; for the start-up log.
struct GpuMemoryReport {
  double utilization = 0;
  size_t total_bytes = 0;
  size_t budget_bytes = 0;
  size_t in_use_bytes = 0;    // after the profiling step, its pool released (all processes)
  size_t weight_bytes = 0;    // the model's weights on the device (computed)
  size_t profiled_bytes = 0;  // what the workspace, graphs, sampler and profiling step took
  size_t kv_bytes = 0;
  size_t draft_bytes = 0;  // a draft model's weights, workspace and pool, still to come
  int num_blocks = 0;
  int block_size = 0;
};
// One line: budget, weights, profiled memory, KV pool in GiB and in tokens.
std::string describe_gpu_memory(const GpuMemoryReport& report);

class Qwen3ModelRunner : public ModelExecutor {
 public:
  // Allocates the KV pool (config.kv_dtype) and the forward workspace; on CUDA also captures
  // the decode graphs and sets up the device sampler. `backend` and `model` must outlive the
  // runner.
  static Result<std::unique_ptr<Qwen3ModelRunner>> create(Backend& backend, Qwen3Model& model,
                                                          const ModelRunnerConfig& config);

  int vocab_size() const override { return model_.config().vocab_size; }
  Status bind_current_thread() override { return backend_.bind_current_thread(); }
  Status execute(const ScheduledBatch& batch, std::span<float> logits,
                 const LayerKvWritten& on_layer_written) override;
  bool samples_on_device() const override { return device_ != nullptr; }
  Status launch_step(const ScheduledBatch& batch, std::span<const SamplingRow> rows,
                     const LayerKvWritten& on_layer_written) override;
  Status sample_step(std::span<const std::span<const int32_t>> allowed,
                     std::span<SampledRow> results, std::span<float> logits) override;
  int max_token_logits() const override { return context_.limits().max_num_seqs; }
  Status token_logits(int entry, int first, int count, std::span<float> logits) override;

  const KvCache& kv_cache() const { return cache_; }
  // For a benchmark or test that runs the model directly on the runner's pool.
  KvCache& kv_cache() { return cache_; }
  // The blocks a scheduler may give out: the pool's, less the graphs' scratch block on CUDA
  // (always the pool's last block).
  int schedulable_blocks() const {
    return cache_.layout().num_blocks - (scratch_block_ >= 0 ? 1 : 0);
  }
  int num_decode_graphs() const { return device_ ? device_->num_graphs() : 0; }
  // Set when the pool was sized by gpu_memory_utilization.
  const std::optional<GpuMemoryReport>& memory_report() const { return memory_report_; }

 private:
  Qwen3ModelRunner(Backend& backend, Qwen3Model& model, KvCache cache, ForwardContext context)
      : backend_(backend), model_(model), cache_(std::move(cache)), context_(std::move(context)) {}
  // slices_ from the batch's entries; logits_rows_ the entry index of each sampling entry.
  void build_slices(const ScheduledBatch& batch);

  Backend& backend_;
  Qwen3Model& model_;
  KvCache cache_;
  ForwardContext context_;
  std::unique_ptr<DeviceStepPath> device_;  // CUDA; null on the CPU
  int scratch_block_ = -1;                  // held back from the scheduler; -1: none
  std::optional<GpuMemoryReport> memory_report_;
  std::vector<SequenceSlice> slices_;
  std::vector<int32_t> logits_rows_;
  std::vector<float> all_logits_;  // one row per entry, when some entries do not sample
  // The launched step's per-layer reports (a prefill step whose KV is being sent).
  std::optional<LayerProgress> layer_progress_;
};

}  // namespace pdserve
