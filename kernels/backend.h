// The backend interface: every operation a Qwen3 forward pass needs, implemented once for the
// CPU (the reference) and once for CUDA. Operations take non-owning views of memory that the
// backend allocated, never allocate themselves, and return a Status. A backend instance owns
// its execution resources (thread pool or CUDA stream); nothing here is global.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/core/dtype.h"
#include "common/core/kv_layout.h"
#include "common/core/status.h"
#include "kernels/cpu_isa.h"

namespace pdserve {

enum class DeviceKind { kCpu, kCuda };

std::string_view device_kind_name(DeviceKind kind);
Result<DeviceKind> parse_device_kind(std::string_view name);

// A --device value: "cpu", "cuda" (device 0) or "cuda:N" (the N-th visible CUDA device, as
// CUDA numbers them under CUDA_VISIBLE_DEVICES). The one parser of device names.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
};
Result<DeviceSpec> parse_device(std::string_view name);

// A 2-D row-major matrix view. `row_stride` is in elements and lets a view select a column
// slice of a wider buffer (e.g. the gate half of a fused gate/up output).
//
// An FP8 weight (dtype kF8E4M3) also has its dequantization multipliers, one float32 per block
// of scale_block_n rows x scale_block_k columns, row-major
// [ceil(rows/scale_block_n), ceil(cols/scale_block_k)] in the same memory space as `data`:
// element (i, j) is fp8_e4m3_to_float(data[i*row_stride + j]) *
// scale[(i / scale_block_n) * ceil(cols / scale_block_k) + j / scale_block_k]
// (common/model/qwen3_weights.h HostTensor). Null scale for every other view.
struct MatrixView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  const float* scale = nullptr;
  int64_t scale_block_n = 0;
  int64_t scale_block_k = 0;

  static MatrixView dense(void* data, DType dtype, int64_t rows, int64_t cols) {
    return {data, dtype, rows, cols, cols};
  }
  // Scale blocks per row of blocks (ceil(cols / scale_block_k)); 0 without a scale.
  int64_t scale_cols() const {
    return scale_block_k > 0 ? (cols + scale_block_k - 1) / scale_block_k : 0;
  }
  template <typename T>
  T* row(int64_t r) const {
    return static_cast<T*>(data) + r * row_stride;
  }
  MatrixView column_slice(int64_t first_col, int64_t num_cols) const;
};

// A 1-D vector view (norm weights).
struct VectorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t size = 0;
};

// The paged KV pool as the kernels see it: where its K and V halves are, and its layout
// (common/core/kv_layout.h).
struct KvCacheView {
  void* k = nullptr;
  void* v = nullptr;
  KvLayout layout;
};

// Describes a packed batch (no padding) of sequences for one forward step. Each sequence
// contributes its new tokens (a whole prompt, a chunk of one, or one decode token) at
// consecutive positions ending at context_len - 1. All arrays live in backend memory.
struct AttentionBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_blocks_per_seq = 0;  // row length of block_tables
  int max_query_len = 0;       // host-side maxima, for launch configuration
  int max_context_len = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token offsets into the packed batch
  const int32_t* context_lens = nullptr;  // [num_seqs] keys visible to the last new token
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq] block ids
  const int32_t* positions = nullptr;     // [num_tokens] absolute position of each token
  const int32_t* slot_mapping = nullptr;  // [num_tokens] KV slot each new token writes
};

// Per-head RMSNorm + rotary embedding parameters of an attention layer.
struct QkNormRopeParams {
  VectorView q_norm_weight;  // [head_dim]
  VectorView k_norm_weight;  // [head_dim]
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Which of a backend's memories an allocation lives in (device memory, or host memory that
// device copies can use without staging).
enum class MemorySpace { kDevice, kHost };
template <MemorySpace kSpace>
class BackendBuffer;
using DeviceBuffer = BackendBuffer<MemorySpace::kDevice>;
using HostBuffer = BackendBuffer<MemorySpace::kHost>;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string description() const = 0;
  // The element type of activations (hidden states, q/k/v, logits are always float32).
  virtual DType activation_dtype() const = 0;
  // The KV cache element type of --kv-cache-dtype auto for a model whose weights are
  // `weight_dtype` (float32 weights ask for float32 arithmetic, so they keep a float32 cache).
  virtual DType default_kv_dtype(DType weight_dtype) const {
    (void)weight_dtype;
    return activation_dtype();
  }
  // True when device memory is host memory (weights can then be used in place).
  virtual bool shares_host_memory() const = 0;

  // ---- memory -------------------------------------------------------------------------
  virtual Result<DeviceBuffer> allocate(size_t bytes) = 0;
  virtual void release(void* data) noexcept = 0;
  virtual Status copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual Status copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all queued work; reports asynchronous failures.
  virtual Status synchronize() = 0;
  // Host memory that copies to and from the device read or write without blocking the caller
  // (page-locked on CUDA: a copy from pageable memory is staged and waits); such a copy may
  // still read or write it until the next synchronize(). Default: aligned host memory.
  virtual Result<HostBuffer> allocate_host(size_t bytes);
  virtual void release_host(void* data) noexcept;
  // Makes the calling thread use this backend's device (cudaSetDevice): every thread that
  // queues work or copies memory calls it first (the engine thread, the KV transfer thread).
  virtual Status bind_current_thread() { return {}; }

  // ---- progress markers -----------------------------------------------------------------
  // Marks the point the queued work has reached as marker `marker` (0 <= marker <
  // kMaxMarkers), so that the host can act on part of a step as soon as the device is past it
  // (a layer's KV sent while the later layers compute: Qwen3Model::compute). A synchronous
  // backend has done the work when its call returns, so its markers are reached at once.
  static constexpr int kMaxMarkers = 1024;
  virtual Status record_marker(int /*marker*/) { return Status::ok_status(); }
  // Whether the device has passed `marker`'s last record_marker; never blocks. An error the
  // device met on the way is returned.
  virtual Result<bool> marker_reached(int /*marker*/) { return true; }

  // ---- operations ----------------------------------------------------------------------
  // out[i] = table[ids[i]].
  virtual Status embedding(MatrixView table, const int32_t* ids, MatrixView out) = 0;
  // out = rmsnorm(in) * weight.
  virtual Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out) = 0;
  // residual += x; x = rmsnorm(residual) * weight (the pre-norm residual stream, fused).
  virtual Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps) = 0;
  // out = in @ weight^T: in [m, k], weight [n, k] (HF layout), out [m, n]. The CPU backend
  // guarantees each output element's reduction order is independent of m and of the thread
  // count, so a sequence's results do not depend on what else is in the batch.
  virtual Status linear(MatrixView in, MatrixView weight, MatrixView out) = 0;
  // In place on q [tokens, heads*head_dim] and k [tokens, kv_heads*head_dim]: per-head
  // RMSNorm, then rotary embedding (HF rotate-half layout) at each token's position; then
  // k and v [tokens, kv_heads*head_dim] are written to the KV pool of `layer` at the
  // batch's slot_mapping.
  virtual Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                                       const QkNormRopeParams& params, const AttentionBatch& batch,
                                       const KvCacheView& cache, int layer) = 0;
  // Causal GQA attention of the batch's new tokens over each sequence's paged KV.
  // q [tokens, heads*head_dim] -> out [tokens, heads*head_dim].
  virtual Status paged_attention(MatrixView q, const AttentionBatch& batch,
                                 const KvCacheView& cache, int layer, int num_heads, float scale,
                                 MatrixView out) = 0;
  // out = silu(gate) * up, elementwise.
  virtual Status silu_mul(MatrixView gate, MatrixView up, MatrixView out) = 0;
  // out[i] = in[indices[i]] for i < out.rows.
  virtual Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out) = 0;
};

// Owns one allocation of a Backend (allocate() or allocate_host()); frees it on destruction.
template <MemorySpace kSpace>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend* owner, void* data, size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  BackendBuffer(BackendBuffer&& other) noexcept { *this = std::move(other); }
  BackendBuffer& operator=(BackendBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

 private:
  void reset() {
    if (owner_ != nullptr && data_ != nullptr) {
      if constexpr (kSpace == MemorySpace::kDevice) {
        owner_->release(data_);
      } else {
        owner_->release_host(data_);
      }
    }
    data_ = nullptr;
    bytes_ = 0;
  }
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct BackendOptions {
  DeviceKind device = DeviceKind::kCpu;
  int num_threads = 0;             // CPU: 0 = all cores
  int device_index = 0;            // CUDA
  CpuIsa cpu_isa = CpuIsa::kAuto;  // CPU: the kernels' instruction-set level (kernels/cpu_isa.h)
  // The element type the backend computes in (--dtype); unset: the device's default. The CPU
  // computes in float32 only. CUDA: bfloat16 (the default; float32 accumulation) or float32,
  // the strict mode: float32 weights, activations and logits, and cuBLAS without TF32 or
  // other reduced-precision reductions, so greedy tokens can equal the CPU backend's.
  std::optional<DType> activation_dtype;
};

// Unavailable when the device is absent or this build lacks it (message says which);
// InvalidArgument for an activation dtype the device does not compute in.
Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

}  // namespace pdserve
