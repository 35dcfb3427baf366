#include "kernels/model/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/sampling_inputs.h"

namespace pdserve {
namespace {

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

int blocks_for(int64_t tokens, int block_size) {
  return static_cast<int>((tokens + block_size - 1) / block_size);
}

// Sizes the pool from config.gpu_memory_utilization: on a temporary pool just large enough,
// captures the decode graphs and runs the largest prefill step (limits.max_num_tokens tokens
// in sequences of at most max_model_len), reads the free memory with all of it in place, then
// lets the temporary pool and graphs go (the real ones take the same memory again).
Result<GpuMemoryReport> plan_pool_from_free_memory(Backend& backend, Qwen3Model& model,
                                                   ForwardContext& context,
                                                   const ModelRunnerConfig& config) {
  const ForwardLimits& limits = config.limits;
  const int tokens = static_cast<int>(std::min<int64_t>(
      limits.max_num_tokens, int64_t{limits.max_num_seqs} * limits.max_model_len));
  std::vector<std::vector<int32_t>> prompts;
  for (int left = tokens; left > 0; left -= limits.max_model_len) {
    prompts.emplace_back(static_cast<size_t>(std::min(left, limits.max_model_len)), 0);
  }
  std::vector<std::vector<int32_t>> tables;
  int blocks = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    const int needed = blocks_for(static_cast<int64_t>(prompt.size()), config.block_size);
    tables.emplace_back(static_cast<size_t>(needed));
    for (int32_t& block : tables.back()) block = blocks++;
  }
  const int scratch_block = blocks++;
  PDS_ASSIGN_OR_RETURN(DeviceMemoryInfo before, device_memory_info(backend));
  GpuMemoryReport report;
  {
    PDS_ASSIGN_OR_RETURN(
        KvCache pool,
        KvCache::create(backend,
                        kv_layout_for(model.config(), blocks, config.block_size, config.kv_dtype),
                        config.kv_scales));
    PDS_ASSIGN_OR_RETURN(
        std::unique_ptr<DeviceStepPath> path,
        make_cuda_step_path(backend, model, pool, context, scratch_block, config.cuda_graphs));
    std::vector<SequenceSlice> slices;
    for (size_t i = 0; i < prompts.size(); ++i) slices.push_back({prompts[i], 0, tables[i]});
    std::vector<float> logits(prompts.size() * static_cast<size_t>(model.config().vocab_size));
    PDS_RETURN_IF_ERROR(path->forward(slices, logits).with_context("profiling step"));
    PDS_ASSIGN_OR_RETURN(DeviceMemoryInfo after, device_memory_info(backend));

    GpuMemoryInputs inputs;
    inputs.total_bytes = after.total_bytes;
    inputs.free_bytes = after.free_bytes;
    inputs.profiling_pool_bytes = pool.size_bytes();
    inputs.utilization = *config.gpu_memory_utilization;
    inputs.kv_bytes_per_block =
        kv_layout_for(model.config(), 1, config.block_size, config.kv_dtype).total_bytes();
    inputs.blocks_per_sequence = blocks_for(limits.max_model_len, config.block_size);
    inputs.reserved_blocks = config.cuda_graphs ? 1 : 0;
    inputs.draft = config.draft;
    PDS_ASSIGN_OR_RETURN(const GpuMemoryPlan plan, plan_gpu_memory(inputs));
    report.utilization = inputs.utilization;
    report.total_bytes = after.total_bytes;
    report.budget_bytes = plan.budget_bytes;
    report.in_use_bytes = plan.other_processes_bytes;
    report.weight_bytes = qwen3_weight_bytes(model.config(), model.weight_dtype());
    report.profiled_bytes = before.free_bytes > after.free_bytes + pool.size_bytes()
                                ? before.free_bytes - after.free_bytes - pool.size_bytes()
                                : 0;
    report.kv_bytes = plan.kv_bytes;
    report.draft_bytes = plan.draft_bytes;
    report.num_blocks = plan.num_blocks;
    report.block_size = config.block_size;
  }
  return report;
}

}  // namespace

size_t device_step_input_bytes(const ForwardLimits& limits) {
  return sampling_input_bytes(
      limits.max_num_seqs, default_sampling_list_ints(limits.max_num_seqs, limits.max_model_len));
}

std::string describe_gpu_memory(const GpuMemoryReport& r) {
  char utilization[16];
  std::snprintf(utilization, sizeof(utilization), "%.2f", r.utilization);
  return "GPU memory: budget " + gib(r.budget_bytes) + " (--gpu-memory-utilization " + utilization +
         " of " + gib(r.total_bytes) + "); in use before the KV cache " + gib(r.in_use_bytes) +
         " (weights " + gib(r.weight_bytes) + ", workspace + graphs + profiling " +
         gib(r.profiled_bytes) + "); KV cache " + gib(r.kv_bytes) + " = " +
         std::to_string(r.num_blocks) +
         " blocks = " + std::to_string(static_cast<int64_t>(r.num_blocks) * r.block_size) +
         " tokens" +
         (r.draft_bytes > 0 ? "; draft model (weights, workspace, KV) " + gib(r.draft_bytes) : "");
}

Result<std::unique_ptr<Qwen3ModelRunner>> Qwen3ModelRunner::create(
    Backend& backend, Qwen3Model& model, const ModelRunnerConfig& config) {
  const bool on_device = !backend.shares_host_memory();
  if (config.block_size < 1) {
    return invalid_argument("model runner: block_size must be >= 1, got " +
                            std::to_string(config.block_size));
  }
  if (config.gpu_memory_utilization && !on_device) {
    return invalid_argument("--gpu-memory-utilization applies to --device cuda; on " +
                            std::string(device_kind_name(backend.kind())) +
                            " the KV cache is sized by --kv-cache-memory-gib");
  }
  // On a device one block is the decode graphs' scratch block: the pool needs another.
  const int least_blocks = on_device && config.cuda_graphs ? 2 : 1;
  if (!config.gpu_memory_utilization && config.num_blocks < least_blocks) {
    return invalid_argument("model runner: num_blocks must be >= " + std::to_string(least_blocks) +
                            ", got " + std::to_string(config.num_blocks));
  }
  const size_t extra_inputs = on_device ? device_step_input_bytes(config.limits) : 0;
  PDS_ASSIGN_OR_RETURN(ForwardContext context,
                       ForwardContext::create(backend, model.config(), config.limits,
                                              config.block_size, extra_inputs));
  int num_blocks = config.num_blocks;
  std::optional<GpuMemoryReport> report;
  if (config.gpu_memory_utilization) {
    PDS_ASSIGN_OR_RETURN(report, plan_pool_from_free_memory(backend, model, context, config));
    num_blocks = report->num_blocks;
  }
  PDS_ASSIGN_OR_RETURN(
      KvCache cache,
      KvCache::create(backend,
                      kv_layout_for(model.config(), num_blocks, config.block_size, config.kv_dtype),
                      config.kv_scales));
  std::unique_ptr<Qwen3ModelRunner> runner(
      new Qwen3ModelRunner(backend, model, std::move(cache), std::move(context)));
  runner->memory_report_ = report;
  if (on_device) {
    runner->scratch_block_ = config.cuda_graphs ? num_blocks - 1 : -1;
    PDS_ASSIGN_OR_RETURN(runner->device_,
                         make_cuda_step_path(backend, model, runner->cache_, runner->context_,
                                             runner->scratch_block_, config.cuda_graphs));
  }
  return runner;
}

void Qwen3ModelRunner::build_slices(const ScheduledBatch& batch) {
  slices_.clear();
  logits_rows_.clear();
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const ScheduledSequence& entry = batch.entries[i];
    slices_.push_back({entry.new_tokens(), entry.num_cached_before, entry.block_table});
    if (entry.samples) logits_rows_.push_back(static_cast<int32_t>(i));
  }
}

Status Qwen3ModelRunner::execute(const ScheduledBatch& batch, std::span<float> logits,
                                 const LayerKvWritten& on_layer_written) {
  const size_t vocab = static_cast<size_t>(vocab_size());
  const size_t num_samples = static_cast<size_t>(batch.num_samples);
  if (logits.size() < num_samples * vocab) {
    return invalid_argument("model runner: the logits buffer holds " +
                            std::to_string(logits.size()) + " floats, step " +
                            std::to_string(batch.step) + " needs " +
                            std::to_string(num_samples * vocab));
  }
  if (batch.empty()) return Status::ok_status();
  build_slices(batch);
  const auto forward = [&](std::span<float> out) -> Status {
    if (!device_) return model_.forward(slices_, cache_, context_, out, on_layer_written);
    PDS_RETURN_IF_ERROR(device_->forward(slices_, out));
    if (on_layer_written) {
      for (int layer = 0; layer < model_.config().num_hidden_layers; ++layer) {
        on_layer_written(layer);
      }
    }
    return Status::ok_status();
  };
  // The model returns one row per slice; when every entry samples those are the rows wanted.
  if (num_samples == slices_.size()) return forward(logits);
  all_logits_.resize(slices_.size() * vocab);
  PDS_RETURN_IF_ERROR(forward(all_logits_));
  for (size_t row = 0; row < logits_rows_.size(); ++row) {
    std::memcpy(logits.data() + row * vocab,
                all_logits_.data() + static_cast<size_t>(logits_rows_[row]) * vocab,
                vocab * sizeof(float));
  }
  return Status::ok_status();
}

Status Qwen3ModelRunner::launch_step(const ScheduledBatch& batch, std::span<const SamplingRow> rows,
                                     const LayerKvWritten& on_layer_written) {
  if (!device_) return unimplemented("model runner: sampling on the device needs --device cuda");
  if (rows.size() != static_cast<size_t>(batch.num_samples)) {
    return invalid_argument("model runner: " + std::to_string(rows.size()) + " sampling rows for " +
                            std::to_string(batch.num_samples) + " sampling entries");
  }
  layer_progress_.emplace(backend_, on_layer_written, model_.config().num_hidden_layers);
  build_slices(batch);
  if (slices_.empty()) return invalid_argument("model runner: an empty batch");
  return device_->launch(slices_, rows, logits_rows_,
                         layer_progress_->active() ? &*layer_progress_ : nullptr);
}

Status Qwen3ModelRunner::sample_step(std::span<const std::span<const int32_t>> allowed,
                                     std::span<SampledRow> results, std::span<float> logits) {
  if (!device_) return unimplemented("model runner: sampling on the device needs --device cuda");
  // Each layer goes to the observer as soon as the device is past its KV write (polled here,
  // on the engine thread, until the last layer's), so a layer's transfer starts while the
  // later layers compute; the step's one wait follows.
  if (layer_progress_) PDS_RETURN_IF_ERROR(layer_progress_->drain());
  PDS_RETURN_IF_ERROR(device_->sample(allowed, results, logits));
  // A step replayed from a graph recorded no markers: its layers are done after the wait.
  if (layer_progress_) layer_progress_->finish_after_wait();
  layer_progress_.reset();
  return Status::ok_status();
}

Status Qwen3ModelRunner::token_logits(int entry, int first, int count, std::span<float> logits) {
  if (entry < 0 || static_cast<size_t>(entry) >= slices_.size() || first < 0 ||
      first + count > static_cast<int>(slices_[static_cast<size_t>(entry)].tokens.size())) {
    return invalid_argument("model runner: token logits [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") of entry " + std::to_string(entry) +
                            " are outside the last step");
  }
  const int packed = context_.host_batch().query_start[static_cast<size_t>(entry)] + first;
  return model_.token_logits(context_, packed, count, logits);
}

}  // namespace pdserve
