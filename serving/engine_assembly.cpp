#include "serving/engine_assembly.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/core/log.h"
#include "kernels/model/model_runner.h"
#include "kernels/model/proposer_factory.h"
#include "serving/draft_proposer_factory.h"
#include "kv_tiers/tier_store.h"
#include "kv_transfer/cuda_pool_copier.h"
#include "kv_transfer/host_pool_copier.h"

namespace pdserve {
namespace {

constexpr double kBytesPerGib = static_cast<double>(1ull << 30);

bool positive_finite(double value) {
  return value > 0 && std::isfinite(value);
}

Status check_kv_tier_settings(const EngineConfig& config) {
  if (!(config.kv_offload_host_gib >= 0) || !std::isfinite(config.kv_offload_host_gib)) {
    return invalid_argument("--kv-offload-host-gib must be a number >= 0");
  }
  const bool disk_dir = !config.kv_offload_disk_dir.empty();
  if (disk_dir && config.kv_offload_host_gib == 0) {
    return invalid_argument(
        "--kv-offload-disk-dir needs --kv-offload-host-gib: the disk tier is below the host tier");
  }
  if (disk_dir != (config.kv_offload_disk_gib != 0)) {
    return invalid_argument("--kv-offload-disk-dir and --kv-offload-disk-gib go together");
  }
  if (disk_dir && !positive_finite(config.kv_offload_disk_gib)) {
    return invalid_argument("--kv-offload-disk-gib must be a positive number");
  }
  return Status::ok_status();
}

// The node's tier store over its pool, with a copier of its own (pinned host memory and a copy
// stream on CUDA, a worker thread on the CPU).
Result<std::unique_ptr<KvTierStore>> make_kv_tier_store(const KvCache& pool,
                                                        const std::filesystem::path& model_dir,
                                                        const EngineConfig& config) {
  kv_tiers::TierStoreOptions options;
  options.layout = pool.layout();
  options.host_capacity_bytes = static_cast<uint64_t>(config.kv_offload_host_gib * kBytesPerGib);
  options.disk_dir = config.kv_offload_disk_dir;
  options.disk_capacity_bytes = static_cast<uint64_t>(config.kv_offload_disk_gib * kBytesPerGib);
  options.fingerprint = kv_tiers::kv_tier_fingerprint(model_dir, pool.layout());
  if (pool.device() == DeviceKind::kCuda) {
    PDS_ASSIGN_OR_RETURN(std::unique_ptr<kv_transfer::PoolCopier> copier,
                         kv_transfer::make_cuda_pool_copier(pool.data(), pool.size_bytes()));
    options.copier = std::move(copier);
  } else {
    options.copier = std::make_shared<kv_transfer::HostPoolCopier>(
        static_cast<std::byte*>(pool.data()), pool.size_bytes());
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<kv_tiers::TierStore> store,
                       kv_tiers::TierStore::create(std::move(options)));
  const KvTierStats stats = store->stats();
  PDS_LOG_INFO("KV tiers: host " + std::to_string(stats.host.capacity_bytes >> 20) + " MiB" +
               (config.kv_offload_disk_dir.empty()
                    ? std::string()
                    : ", disk " + std::to_string(stats.disk.capacity_bytes >> 20) + " MiB in " +
                          config.kv_offload_disk_dir + " (" + std::to_string(stats.disk.blocks) +
                          " blocks kept)"));
  return std::unique_ptr<KvTierStore>(std::move(store));
}

}  // namespace

Result<std::unique_ptr<LlmEngine>> make_llm_engine(LoadedModel& model, Tokenizer tokenizer,
                                                   const EngineConfig& config,
                                                   const KvConnectorFactory& connector_factory) {
  if (model.backend == nullptr || model.model == nullptr) {
    return invalid_argument("make_llm_engine: the model is not loaded");
  }
  const ModelConfig& model_config = model.model->config();
  const bool on_device = !model.backend->shares_host_memory();
  if (config.kv_cache_memory_gib &&
      (!(*config.kv_cache_memory_gib > 0) || !std::isfinite(*config.kv_cache_memory_gib))) {
    return invalid_argument("--kv-cache-memory-gib must be a positive number");
  }
  PDS_RETURN_IF_ERROR(check_gpu_memory_utilization(config.gpu_memory_utilization));
  PDS_RETURN_IF_ERROR(check_kv_tier_settings(config));
  if (config.block_size < 1 || config.block_size > 256) {
    return invalid_argument("--block-size must be in [1, 256], got " +
                            std::to_string(config.block_size));
  }
  if (config.max_model_len < 0 || config.max_model_len > model_config.max_position_embeddings) {
    return invalid_argument(
        "--max-model-len must be in [0, " + std::to_string(model_config.max_position_embeddings) +
        "] (max_position_embeddings), got " + std::to_string(config.max_model_len));
  }
  const int max_model_len =
      config.max_model_len > 0 ? config.max_model_len : model_config.max_position_embeddings;
  const DType kv_dtype =
      config.kv_cache_dtype.value_or(model.backend->default_kv_dtype(model.model->weight_dtype()));

  ModelRunnerConfig runner_config;
  runner_config.block_size = config.block_size;
  runner_config.kv_dtype = kv_dtype;
  PDS_ASSIGN_OR_RETURN(
      runner_config.kv_scales,
      kv_scales_for_model(model.model_dir, kv_dtype, model_config.num_hidden_layers));
  if (!runner_config.kv_scales.k.empty()) {
    PDS_LOG_INFO("fp8 KV cache with the checkpoint's per-layer k_scale / v_scale");
  }
  runner_config.limits.max_num_tokens = config.max_num_batched_tokens;
  runner_config.limits.max_num_seqs = config.max_num_seqs;
  runner_config.limits.max_model_len = max_model_len;
  if (on_device && !config.kv_cache_memory_gib) {
    runner_config.gpu_memory_utilization = config.gpu_memory_utilization;
    // The draft's weights, workspace and pool come out of the same budget.
    if (config.speculative && config.speculative->method == SpeculativeMethod::kDraftModel) {
      PDS_ASSIGN_OR_RETURN(runner_config.draft,
                           draft_device_memory(config.speculative->model, *model.backend, config,
                                               runner_config.limits));
    }
  } else {
    const double gib = config.kv_cache_memory_gib.value_or(kDefaultCpuKvCacheMemoryGib);
    const int num_blocks = kv_blocks_for_memory(
        model_config, static_cast<size_t>(gib * static_cast<double>(1ull << 30)), config.block_size,
        kv_dtype);
    // On a device one block is the decode graphs' scratch block.
    if (num_blocks < (on_device ? 2 : 1)) {
      return resource_exhausted("--kv-cache-memory-gib " + std::to_string(gib) +
                                " holds no KV block of this model");
    }
    runner_config.num_blocks = num_blocks;
  }

  SchedulerConfig scheduler;
  scheduler.block_size = config.block_size;
  scheduler.max_num_batched_tokens = config.max_num_batched_tokens;
  scheduler.max_num_seqs = config.max_num_seqs;
  scheduler.max_num_waiting = config.max_num_waiting;
  scheduler.max_model_len = max_model_len;
  scheduler.vocab_size = model_config.vocab_size;
  scheduler.eos_token_ids = model.eos_token_ids();
  scheduler.num_blocks = std::max(runner_config.num_blocks, 1);  // checked again below
  PDS_RETURN_IF_ERROR(scheduler.validate());

  PDS_ASSIGN_OR_RETURN(std::unique_ptr<Qwen3ModelRunner> runner,
                       Qwen3ModelRunner::create(*model.backend, *model.model, runner_config));
  if (runner->memory_report()) PDS_LOG_INFO(describe_gpu_memory(*runner->memory_report()));
  // The scheduler never hands out the decode graphs' scratch block.
  scheduler.num_blocks = runner->schedulable_blocks();
  PDS_RETURN_IF_ERROR(scheduler.validate());

  LlmEngineConfig engine_config;
  engine_config.scheduler = std::move(scheduler);
  engine_config.model_name =
      config.served_model_name.empty() ? model.default_name : config.served_model_name;
  engine_config.generation_defaults = model.sampling_defaults();
  engine_config.kv_tier_policy = config.kv_tier_policy;
  std::unique_ptr<KvConnector> connector;
  if (connector_factory) {
    PDS_ASSIGN_OR_RETURN(connector, connector_factory(runner->kv_cache()));
  }
  std::unique_ptr<Proposer> proposer;
  if (config.speculative) {
    DraftModelProposerConfig draft;
    if (config.speculative->method == SpeculativeMethod::kDraftModel) {
      // The draft's pool holds as many tokens as the target's: every sequence can be drafted for.
      DraftProposerSettings settings;
      settings.model = config.speculative->model;
      settings.num_speculative_tokens = config.speculative->num_speculative_tokens;
      settings.target_pool_tokens = runner->schedulable_blocks() * config.block_size;
      PDS_ASSIGN_OR_RETURN(draft, draft_proposer_config(model, config, settings));
    }
    PDS_ASSIGN_OR_RETURN(proposer, make_proposer(*config.speculative, model, draft));
    engine_config.speculative = config.speculative;
  }
  std::unique_ptr<KvTierStore> tiers;
  if (config.kv_offload_host_gib > 0) {
    PDS_ASSIGN_OR_RETURN(tiers, make_kv_tier_store(runner->kv_cache(), model.model_dir, config));
  }
  LlmEngineParts parts;
  parts.connector = std::move(connector);
  parts.tiers = std::move(tiers);
  parts.proposer = std::move(proposer);
  return LlmEngine::create(std::move(runner), std::move(tokenizer), std::move(engine_config),
                           std::move(parts));
}

}  // namespace pdserve
