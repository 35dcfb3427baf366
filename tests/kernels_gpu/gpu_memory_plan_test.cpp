// The GPU memory plan against hand-computed budgets, and its weight/workspace estimates
// against independent sources: the bytes the synthetic checkpoint writer reports, and the
// bytes ForwardContext::create actually allocates.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cpu_backend.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

ModelConfig qwen3_0_6b_config() {
  return load_model_config(std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-0.6b/config.json")
      .value();
}

GpuMemoryInputs h100_like() {
  GpuMemoryInputs in;
  in.total_bytes = 80 * kGiB;
  in.free_bytes = 79 * kGiB;  // 1 GiB held by the driver context / another process
  in.weight_bytes = 16 * kGiB;
  in.workspace_bytes = 2 * kGiB;
  in.utilization = 0.9;
  in.kv_bytes_per_block = 2 * 1024 * 1024;  // 2 MiB
  in.blocks_per_sequence = 256;
  return in;
}

TEST(GpuMemoryPlan, KvPoolTakesWhatTheBudgetLeaves) {
  const GpuMemoryPlan plan = plan_gpu_memory(h100_like()).value();
  // 72 GiB budget - 1 GiB other - 16 GiB weights - 2 GiB workspace = 53 GiB = 27136 blocks.
  EXPECT_EQ(plan.budget_bytes, 72 * kGiB);
  EXPECT_EQ(plan.other_processes_bytes, 1 * kGiB);
  EXPECT_EQ(plan.num_blocks, 27136);
  EXPECT_EQ(plan.kv_bytes, 53 * kGiB);
}

TEST(GpuMemoryPlan, PartialBlocksAreDroppedAndUtilizationOneUsesAll) {
  GpuMemoryInputs in = h100_like();
  in.free_bytes = in.total_bytes;
  in.utilization = 1.0;
  in.kv_bytes_per_block = 3 * 1024 * 1024;
  const GpuMemoryPlan plan = plan_gpu_memory(in).value();
  EXPECT_EQ(plan.num_blocks, static_cast<int>((62 * kGiB) / in.kv_bytes_per_block));
  EXPECT_LE(plan.kv_bytes + in.weight_bytes + in.workspace_bytes, in.total_bytes);
}

TEST(GpuMemoryPlan, ModelThatDoesNotFitIsResourceExhausted) {
  GpuMemoryInputs in = h100_like();
  in.weight_bytes = 70 * kGiB;
  const Status status = plan_gpu_memory(in).status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("model does not fit"), std::string::npos) << status.to_string();
  EXPECT_NE(status.message().find("70.00 GiB"), std::string::npos) << status.to_string();
}

TEST(GpuMemoryPlan, NoRoomForOneSequenceIsResourceExhausted) {
  GpuMemoryInputs in = h100_like();
  in.weight_bytes = 68 * kGiB;  // leaves 1 GiB = 512 blocks
  in.blocks_per_sequence = 513;
  const Status status = plan_gpu_memory(in).status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("no room for one sequence"), std::string::npos);
  in.blocks_per_sequence = 512;
  EXPECT_EQ(plan_gpu_memory(in).value().num_blocks, 512);
}

// The runner's measured use: free memory read after the weights, workspace, graphs and a
// profiling step are in place; the profiling step's pool goes back before the real one comes.
TEST(GpuMemoryPlan, MeasuredUseCountsEverythingButTheProfilingPool) {
  GpuMemoryInputs in;
  in.total_bytes = 80 * kGiB;
  in.free_bytes = 58 * kGiB;           // 22 GiB in use: others, weights, workspace, profiling
  in.profiling_pool_bytes = 2 * kGiB;  // of which the profiling pool, released
  in.utilization = 0.9;
  in.kv_bytes_per_block = 2 * 1024 * 1024;
  in.blocks_per_sequence = 256;
  in.reserved_blocks = 1;
  const GpuMemoryPlan plan = plan_gpu_memory(in).value();
  // 72 GiB budget - 20 GiB kept in use = 52 GiB of blocks.
  EXPECT_EQ(plan.other_processes_bytes, 20 * kGiB);
  EXPECT_EQ(plan.num_blocks, 52 * 512);
  // The reserved (scratch) block comes on top of one sequence's need: 0.5 GiB left holds
  // 256 blocks, one sequence of 256 blocks, but not that and the scratch block.
  in.free_bytes = in.total_bytes - 72 * kGiB + 512 * 1024 * 1024 - in.profiling_pool_bytes;
  in.reserved_blocks = 0;
  EXPECT_EQ(plan_gpu_memory(in).value().num_blocks, 256);
  in.reserved_blocks = 1;
  const Status status = plan_gpu_memory(in).status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("reserved"), std::string::npos) << status.to_string();
  EXPECT_EQ(check_gpu_memory_utilization(0.9).code(), StatusCode::kOk);
  EXPECT_EQ(check_gpu_memory_utilization(0.0).code(), StatusCode::kInvalidArgument);
  in.profiling_pool_bytes = in.total_bytes;  // more than is in use
  EXPECT_EQ(plan_gpu_memory(in).status().code(), StatusCode::kInvalidArgument);
}

// A draft model (speculative decoding) takes its weights and workspace off the top, and its
// pool grows with the target's: every target block costs its own KV plus the draft's.
TEST(GpuMemoryPlan, ADraftModelComesOutOfTheBudget) {
  GpuMemoryInputs in = h100_like();
  in.draft.fixed_bytes = 3 * kGiB;
  in.draft.kv_bytes_per_block = 1024 * 1024;  // half the target's 2 MiB
  const GpuMemoryPlan plan = plan_gpu_memory(in).value();
  // 72 GiB budget - 1 other - 16 weights - 2 workspace - 3 draft = 50 GiB at 3 MiB a block.
  EXPECT_EQ(plan.num_blocks, static_cast<int>((50 * kGiB) / (3 * 1024 * 1024)));
  EXPECT_EQ(plan.kv_bytes, static_cast<size_t>(plan.num_blocks) * 2 * 1024 * 1024);
  EXPECT_EQ(plan.draft_bytes, 3 * kGiB + static_cast<size_t>(plan.num_blocks) * 1024 * 1024);
  // Everything fits the budget, and one more block of both pools would not.
  const size_t used = plan.other_processes_bytes + in.weight_bytes + in.workspace_bytes;
  EXPECT_LE(used + plan.kv_bytes + plan.draft_bytes, plan.budget_bytes);
  EXPECT_GT(used + plan.kv_bytes + plan.draft_bytes + 3 * 1024 * 1024, plan.budget_bytes);
  // Without the draft the target's pool is larger: 53 GiB of 2 MiB blocks.
  EXPECT_EQ(plan_gpu_memory(h100_like()).value().draft_bytes, 0u);
  EXPECT_GT(plan_gpu_memory(h100_like()).value().num_blocks, plan.num_blocks);
  // A draft that does not fit beside the target is named.
  in.draft.fixed_bytes = 60 * kGiB;
  const Status status = plan_gpu_memory(in).status();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("draft model 60.00 GiB"), std::string::npos)
      << status.to_string();
}

// Qwen3-0.6B as a draft in bf16: its published parameter count, the workspace ForwardContext
// allocates for the draft's limits (max_model_len capped at its 40960 positions, as the
// proposer caps it) and 28 layers x 8 KV heads x 128 x K,V x 2 B = 112 KiB a token.
TEST(GpuMemoryPlan, DraftMemoryOfQwen3_0_6B) {
  const ModelConfig config = qwen3_0_6b_config();
  ForwardLimits limits;
  limits.max_num_tokens = 512;
  limits.max_num_seqs = 16;
  limits.max_model_len = 131072;  // the target's, longer than the draft's positions
  const DraftMemory draft = draft_memory(config, DType::kBF16, DType::kBF16, limits, 16);
  ForwardLimits capped = limits;
  capped.max_model_len = 40960;
  EXPECT_EQ(draft.fixed_bytes,
            size_t{596049920} * 2 + forward_workspace_bytes(config, capped, 16, DType::kBF16));
  EXPECT_EQ(draft.kv_bytes_per_block, size_t{112} * 1024 * 16);
  // An fp8 KV cache halves it.
  EXPECT_EQ(draft_memory(config, DType::kBF16, DType::kF8E4M3, limits, 16).kv_bytes_per_block,
            size_t{56} * 1024 * 16);
}

TEST(GpuMemoryPlan, BadUtilizationAndInputsAreInvalidArgument) {
  for (double utilization : {0.0, -0.5, 1.01, std::nan("")}) {
    GpuMemoryInputs in = h100_like();
    in.utilization = utilization;
    EXPECT_EQ(plan_gpu_memory(in).status().code(), StatusCode::kInvalidArgument) << utilization;
  }
  GpuMemoryInputs in = h100_like();
  in.free_bytes = in.total_bytes + 1;
  EXPECT_EQ(plan_gpu_memory(in).status().code(), StatusCode::kInvalidArgument);
  in = h100_like();
  in.kv_bytes_per_block = 0;
  EXPECT_EQ(plan_gpu_memory(in).status().code(), StatusCode::kInvalidArgument);
}

// The checkpoint writer counts the tensor bytes it wrote; the estimate must agree exactly.
TEST(GpuMemoryPlan, WeightBytesMatchAWrittenCheckpoint) {
  for (bool tie : {true, false}) {
    SyntheticCheckpointOptions options;
    options.config_path =
        std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference/configs/hd64_gqa4.json";
    options.out_dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
                      ("gpu-plan-" + std::to_string(::getpid()) + (tie ? "-tied" : "-untied"));
    options.num_layers = 2;
    options.dtype = DType::kBF16;
    options.tie_word_embeddings = tie;
    options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
    const SyntheticCheckpoint written = write_synthetic_checkpoint(options).value();
    EXPECT_EQ(qwen3_weight_bytes(written.config, DType::kBF16), written.weight_bytes) << tie;
    std::filesystem::remove_all(options.out_dir);
  }
}

// An FP8 checkpoint's projections count one byte a weight plus their float32 scales: what the
// loader holds, tensor by tensor.
TEST(GpuMemoryPlan, WeightBytesOfAnFp8ModelAreWhatTheLoaderHolds) {
  SyntheticCheckpointOptions options;
  options.config_path =
      std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference/configs/hd64_gqa4.json";
  options.out_dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
                    ("gpu-plan-fp8-" + std::to_string(::getpid()));
  options.num_layers = 2;
  options.dtype = DType::kBF16;
  options.fp8 = true;
  options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  const SyntheticCheckpoint written = write_synthetic_checkpoint(options).value();
  const Checkpoint checkpoint = Checkpoint::open(options.out_dir).value();
  const Qwen3Weights weights = load_qwen3_weights(checkpoint, DType::kBF16).value();
  size_t held = weights.embed_tokens.nbytes() + weights.final_norm.nbytes();
  if (!written.config.tie_word_embeddings) held += weights.lm_head.nbytes();
  for (const Qwen3LayerWeights& l : weights.layers) {
    for (const HostTensor* t : {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj,
                                &l.q_norm, &l.k_norm, &l.post_attention_layernorm, &l.gate_proj,
                                &l.up_proj, &l.down_proj}) {
      held += t->nbytes() + static_cast<size_t>(t->scale_count()) * sizeof(float);
    }
  }
  EXPECT_EQ(weights.layers[0].gate_proj.dtype, DType::kF8E4M3);
  EXPECT_EQ(qwen3_weight_bytes(written.config, DType::kBF16), held);
  ModelConfig unquantized = written.config;
  unquantized.quantization.reset();
  EXPECT_LT(held, qwen3_weight_bytes(unquantized, DType::kBF16));
  std::filesystem::remove_all(options.out_dir);
}

TEST(GpuMemoryPlan, WeightBytesOfQwen3_0_6BArePublishedParameterCount) {
  const ModelConfig config = qwen3_0_6b_config();
  // Qwen3-0.6B: 596,049,920 parameters (tied embeddings), as the Hub's safetensors report.
  EXPECT_EQ(qwen3_weight_bytes(config, DType::kBF16), size_t{596049920} * 2);
}

TEST(GpuMemoryPlan, WorkspaceBytesMatchWhatForwardContextAllocates) {
  const ModelConfig config = qwen3_0_6b_config();
  ForwardLimits limits;
  limits.max_num_tokens = 64;
  limits.max_num_seqs = 8;
  limits.max_model_len = 1000;
  // A backend that records each allocation (memory from the CPU backend) and claims bf16
  // activations, as the CUDA backend does.
  std::unique_ptr<Backend> cpu = std::move(make_cpu_backend(1)).value();
  size_t allocated = 0;
  class Recording final : public Backend {
   public:
    Recording(Backend& inner, size_t& total) : inner_(inner), total_(total) {}
    DeviceKind kind() const override { return inner_.kind(); }
    std::string description() const override { return "recording"; }
    DType activation_dtype() const override { return DType::kBF16; }
    bool shares_host_memory() const override { return true; }
    Result<DeviceBuffer> allocate(size_t bytes) override {
      total_ += bytes;
      PDS_ASSIGN_OR_RETURN(DeviceBuffer inner, inner_.allocate(bytes));
      void* data = inner.data();
      held_.push_back(std::move(inner));
      return DeviceBuffer(nullptr, data, bytes);  // the inner buffer keeps ownership
    }
    void release(void*) noexcept override {}
    Status copy_to_device(void*, const void*, size_t) override { return {}; }
    Status copy_to_host(void*, const void*, size_t) override { return {}; }
    Status synchronize() override { return {}; }
    Status embedding(MatrixView, const int32_t*, MatrixView) override { return {}; }
    Status rms_norm(MatrixView, VectorView, float, MatrixView) override { return {}; }
    Status add_rms_norm(MatrixView, MatrixView, VectorView, float) override { return {}; }
    Status linear(MatrixView, MatrixView, MatrixView) override { return {}; }
    Status qk_norm_rope_kv_write(MatrixView, MatrixView, MatrixView, const QkNormRopeParams&,
                                 const AttentionBatch&, const KvCacheView&, int) override {
      return {};
    }
    Status paged_attention(MatrixView, const AttentionBatch&, const KvCacheView&, int, int, float,
                           MatrixView) override {
      return {};
    }
    Status silu_mul(MatrixView, MatrixView, MatrixView) override { return {}; }
    Status gather_rows(MatrixView, const int32_t*, MatrixView) override { return {}; }

   private:
    Backend& inner_;
    size_t& total_;
    std::vector<DeviceBuffer> held_;
  };
  Recording recording(*cpu, allocated);
  {
    const ForwardContext context = ForwardContext::create(recording, config, limits, 16).value();
    EXPECT_EQ(context.max_blocks_per_seq(), 63);
  }
  EXPECT_EQ(forward_workspace_bytes(config, limits, 16, DType::kBF16), allocated);
}

}  // namespace
}  // namespace pdserve
