// The paged KV pool of one node: a single backend allocation holding K then V for every
// layer, as common/core/kv_layout.h describes. One allocation so that the KV transfer layer
// can register it once.
#pragma once

#include <optional>
#include <string_view>

#include "common/core/kv_layout.h"
#include "common/model/model_config.h"
#include "kernels/backend.h"
#include "kernels/model/kv_scales.h"

namespace pdserve {

// The layout of a pool of `num_blocks` blocks for `config`.
KvLayout kv_layout_for(const ModelConfig& config, int num_blocks, int block_size, DType dtype);
// How many blocks fit in `memory_bytes` (at least 0).
int kv_blocks_for_memory(const ModelConfig& config, size_t memory_bytes, int block_size,
                         DType dtype);

// A --kv-cache-dtype value: "auto" (nullopt: Backend::default_kv_dtype()), "bfloat16",
// "float32", or "fp8" / "fp8_e4m3" (vLLM's names: FP8 E4M3 with per-layer scales). float16 and
// fp8_e5m2 are refused: the kernels do not store them.
Result<std::optional<DType>> parse_kv_cache_dtype(std::string_view name);

class KvCache {
 public:
  // ResourceExhausted when the backend cannot allocate it; InvalidArgument for a bad shape.
  // `scales` only for an FP8 layout: positive, finite, num_layers each (or empty).
  static Result<KvCache> create(Backend& backend, const KvLayout& layout, KvScales scales = {});

  const KvLayout& layout() const { return layout_; }
  const KvScales& scales() const { return scales_; }
  KvCacheView view() const;
  void* data() const { return buffer_.data(); }
  // Where the pool lives (host memory for the CPU backend, device memory for CUDA).
  DeviceKind device() const { return device_; }
  size_t size_bytes() const { return buffer_.size(); }
  // The backend that allocated the pool: a thread that moves its bytes (the KV transfer
  // thread) binds itself to its device with backend().bind_current_thread().
  Backend& backend() const { return *backend_; }

 private:
  KvCache(KvLayout layout, KvScales scales, Backend& backend, DeviceBuffer buffer)
      : layout_(layout),
        scales_(std::move(scales)),
        device_(backend.kind()),
        backend_(&backend),
        buffer_(std::move(buffer)) {}

  KvLayout layout_;
  KvScales scales_;
  DeviceKind device_;
  Backend* backend_;
  DeviceBuffer buffer_;
};

}  // namespace pdserve
