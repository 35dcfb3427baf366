#include "kv_transfer/cuda_pool_copier.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"

namespace pdserve::kv_transfer {
namespace {

class CudaPoolCopier final : public PoolCopier {
 public:
  CudaPoolCopier(std::byte* pool, std::uint64_t pool_bytes, int device)
      : pool_(pool), pool_bytes_(pool_bytes), device_(device) {}

  ~CudaPoolCopier() override {
    // Errors cannot be reported from a destructor. The synchronize also runs every pending
    // host callback, which reads this object.
    static_cast<void>(cudaSetDevice(device_));
    if (stream_ != nullptr) static_cast<void>(cudaStreamSynchronize(stream_));
    for (auto& [id, event] : batches_) static_cast<void>(cudaEventDestroy(event));
    for (cudaEvent_t event : spare_events_) static_cast<void>(cudaEventDestroy(event));
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
  }

  Status init() {
    PDS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    PDS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return Status::ok_status();
  }

  std::string description() const override { return "cuda:" + std::to_string(device_); }
  std::uint64_t pool_bytes() const override { return pool_bytes_; }

  Status bind_thread() override {
    PDS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return Status::ok_status();
  }

  Result<StagingMemory> allocate_staging(std::size_t bytes) override {
    if (bytes == 0) return invalid_argument("staging memory: zero bytes");
    PDS_RETURN_IF_ERROR(bind_thread());
    void* memory = nullptr;
    const cudaError_t error = cudaHostAlloc(&memory, bytes, cudaHostAllocPortable);
    if (error != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // not sticky: clear it
      return resource_exhausted("staging memory: cannot pin " + std::to_string(bytes) +
                                " bytes of host memory: " + cudaGetErrorString(error));
    }
    return StagingMemory(static_cast<std::byte*>(memory),
                         [](std::byte* data) { static_cast<void>(cudaFreeHost(data)); });
  }

  Result<CopyBatchId> start(CopyDirection direction, std::span<const PoolCopy> copies) override {
    PDS_RETURN_IF_ERROR(validate_pool_copies(copies, pool_bytes_));
    std::lock_guard lock(mutex_);
    PDS_RETURN_IF_ERROR(bind_thread());
    for (const PoolCopy& copy : copies) {
      std::byte* device = pool_ + copy.pool_offset;
      if (direction == CopyDirection::kToHost) {
        PDS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(copy.host, device, copy.bytes, cudaMemcpyDeviceToHost, stream_));
      } else {
        PDS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(device, copy.host, copy.bytes, cudaMemcpyHostToDevice, stream_));
      }
    }
    cudaEvent_t event = nullptr;
    if (spare_events_.empty()) {
      PDS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = spare_events_.back();
      spare_events_.pop_back();
    }
    const cudaError_t recorded = cudaEventRecord(event, stream_);
    if (recorded != cudaSuccess) {
      spare_events_.push_back(event);
      return cuda_status(recorded, "cudaEventRecord", __FILE__, __LINE__);
    }
    PDS_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream_, &CudaPoolCopier::batch_done, this));
    const CopyBatchId id = next_batch_++;
    batches_.emplace(id, event);
    return id;
  }

  Result<bool> finished(CopyBatchId batch) override {
    std::lock_guard lock(mutex_);
    auto it = batches_.find(batch);
    if (it == batches_.end()) return not_found("pool copy: no batch " + std::to_string(batch));
    PDS_RETURN_IF_ERROR(bind_thread());
    const cudaError_t state = cudaEventQuery(it->second);
    if (state == cudaErrorNotReady) return false;
    const cudaEvent_t event = it->second;
    batches_.erase(it);
    if (state != cudaSuccess) {
      static_cast<void>(cudaEventDestroy(event));
      return cuda_status(state, "a staging copy (cudaEventQuery)", __FILE__, __LINE__);
    }
    spare_events_.push_back(event);
    return true;
  }

  void set_on_finished(std::function<void()> notify) override {
    std::lock_guard lock(notify_mutex_);
    notify_ = std::move(notify);
  }

 private:
  // A CUDA host callback: no CUDA call may be made here, and it must not wait for mutex_,
  // which start() holds while a CUDA call may wait for this callback's thread.
  static void CUDART_CB batch_done(void* self) {
    auto* copier = static_cast<CudaPoolCopier*>(self);
    std::function<void()> notify;
    {
      std::lock_guard lock(copier->notify_mutex_);
      notify = copier->notify_;
    }
    if (notify) notify();
  }

  std::byte* pool_;
  std::uint64_t pool_bytes_;
  int device_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::map<CopyBatchId, cudaEvent_t> batches_;
  std::vector<cudaEvent_t> spare_events_;
  CopyBatchId next_batch_ = 1;
  std::mutex notify_mutex_;
  std::function<void()> notify_;
};

}  // namespace

Result<std::unique_ptr<PoolCopier>> make_cuda_pool_copier(void* pool, std::uint64_t pool_bytes) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pool);
  if (error != cudaSuccess || attributes.type != cudaMemoryTypeDevice) {
    static_cast<void>(cudaGetLastError());
    return invalid_argument("the staging path's CUDA copier needs a KV pool in device memory");
  }
  auto copier = std::make_unique<CudaPoolCopier>(static_cast<std::byte*>(pool), pool_bytes,
                                                 attributes.device);
  if (const Status started = copier->init(); !started.ok()) {
    return unavailable("the staging path's copy stream: " + started.message());
  }
  return std::unique_ptr<PoolCopier>(std::move(copier));
}

}  // namespace pdserve::kv_transfer
