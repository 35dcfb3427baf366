// A backend with memory of its own, as CUDA's (host vectors stand in for device memory), that
// runs no op: for tests of what placing a model allocates and copies, on machines without a
// GPU.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace pdserve {

// bf16 activations as CUDA; the ops are never called.
class DeviceStandIn final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string description() const override { return "device stand-in"; }
  DType activation_dtype() const override { return DType::kBF16; }
  bool shares_host_memory() const override { return false; }
  Result<DeviceBuffer> allocate(size_t bytes) override {
    buffers_.push_back(std::make_unique<std::vector<std::byte>>(bytes));
    return DeviceBuffer(nullptr, buffers_.back()->data(), bytes);  // buffers_ keeps ownership
  }
  void release(void*) noexcept override {}
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  Status synchronize() override { return {}; }
  Status embedding(MatrixView, const int32_t*, MatrixView) override { return unused(); }
  Status rms_norm(MatrixView, VectorView, float, MatrixView) override { return unused(); }
  Status add_rms_norm(MatrixView, MatrixView, VectorView, float) override { return unused(); }
  Status linear(MatrixView, MatrixView, MatrixView) override { return unused(); }
  Status qk_norm_rope_kv_write(MatrixView, MatrixView, MatrixView, const QkNormRopeParams&,
                               const AttentionBatch&, const KvCacheView&, int) override {
    return unused();
  }
  Status paged_attention(MatrixView, const AttentionBatch&, const KvCacheView&, int, int, float,
                         MatrixView) override {
    return unused();
  }
  Status silu_mul(MatrixView, MatrixView, MatrixView) override { return unused(); }
  Status gather_rows(MatrixView, const int32_t*, MatrixView) override { return unused(); }

  size_t allocated() const {
    size_t total = 0;
    for (const auto& buffer : buffers_) total += buffer->size();
    return total;
  }
  // Whether some allocation holds exactly `bytes`.
  bool holds(const std::vector<std::byte>& bytes) const {
    for (const auto& buffer : buffers_) {
      if (*buffer == bytes) return true;
    }
    return false;
  }

 private:
  static Status unused() { return unimplemented("the placement test runs no op"); }
  std::vector<std::unique_ptr<std::vector<std::byte>>> buffers_;
};

}  // namespace pdserve
