// The backend interface: every operation a Qwen3 forward pass needs, implemented once for the
// CPU (the reference) and once for CUDA. Operations take non-owning views of memory that the
// backend allocated, never allocate themselves, and return a Status. A backend instance owns
// its execution resources (thread pool or CUDA stream); nothing here is global.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/core/dtype.h"
#include "common/core/kv_layout.h"
#include "common/core/status.h"
#include "kernels/cpu_isa.h"

namespace pdserve {

enum class DeviceKind { kCpu, kCuda };

std::string_view device_kind_name(DeviceKind kind);
Result<DeviceKind> parse_device_kind(std::string_view name);

// A 2-D row-major matrix view. `row_stride` is in elements and lets a view select a column
// slice of a wider buffer (e.g. the gate half of a fused gate/up output).
struct MatrixView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;

  static MatrixView dense(void* data, DType dtype, int64_t rows, int64_t cols) {
    return {data, dtype, rows, cols, cols};
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

class DeviceBuffer;

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

// Owns one allocation of a Backend; frees it on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* data, size_t bytes)
      : owner_(owner), data_(data), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = other.owner_;
      data_ = other.data_;
      bytes_ = other.bytes_;
      other.owner_ = nullptr;
      other.data_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }

 private:
  void reset() {
    if (owner_ != nullptr && data_ != nullptr) owner_->release(data_);
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
};

// Unavailable when the device is absent or this build lacks it (message says which).
Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

}  // namespace pdserve
