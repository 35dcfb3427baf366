// Launchers of the CUDA kernels. They take views of device memory and a stream, validate
// nothing the shared op checks already validated, never allocate, and return the launch's
// cudaError_t. Indices that can only be checked on the device (token ids, KV slots, block
// ids, gather rows) set a bit in `error_word`, which the backend reports at synchronize().
// Activations (and the KV pool) are bfloat16 or float32, one kernel instance per element
// type; the views of one launch share the activation type (norm weights may be any dtype),
// and another dtype is cudaErrorInvalidValue (the backend refuses such views first).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/core/dtype_enum.h"
#include "common/core/kv_layout.h"

namespace pdserve::cuda {

// Device code is C++17 (see the top-level CMakeLists.txt) and cannot include backend.h, so
// the launchers take these mirrors of its views; cuda_backend.cpp converts field by field.
// The KV pool's layout is the shared KvLayout itself (common/core/kv_layout.h).
struct Matrix {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

struct Vector {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t size = 0;
};

// The pool and the scales of the layer a launch reads or writes (FP8: stored x / scale, read
// code * scale; 1 for other dtypes).
struct KvPool {
  void* k = nullptr;
  void* v = nullptr;
  KvLayout layout;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

struct Batch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_blocks_per_seq = 0;
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
};

struct RopeArgs {
  Vector q_norm_weight;
  Vector k_norm_weight;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// The host plan's launch figures (cuda_attention_plan.h).
struct AttentionLaunch {
  int group = 0;
  int num_splits = 1;
  int keys_per_split = 0;
  int grid_x = 0;
  size_t shared_bytes = 0;
};

enum DeviceErrorBit : unsigned {
  kTokenIdOutOfRange = 1u << 0,
  kKvSlotOutOfRange = 1u << 1,
  kBlockIdOutOfRange = 1u << 2,
  kRowIndexOutOfRange = 1u << 3,
};

cudaError_t embedding(Matrix table, const int32_t* ids, Matrix out, unsigned* error_word,
                      cudaStream_t stream);
cudaError_t silu_mul(Matrix gate, Matrix up, Matrix out, cudaStream_t stream);
cudaError_t gather_rows(Matrix in, const int32_t* indices, Matrix out, unsigned* error_word,
                        cudaStream_t stream);

// out = rmsnorm(in) * weight; with `add` set: sum = in + add is stored to `sum_out` first and
// normalized instead (the fused residual update; in/out and add/sum_out may alias).
cudaError_t rms_norm(Matrix in, Matrix add, Matrix sum_out, Vector weight, float eps, Matrix out,
                     cudaStream_t stream);

cudaError_t qk_norm_rope_kv_write(Matrix q, Matrix k, Matrix v, const RopeArgs& params,
                                  const Batch& batch, const KvPool& cache, int layer,
                                  unsigned* error_word, cudaStream_t stream);

// Lets the attention kernel use `bytes` of dynamic shared memory (the plan's shared_bytes for
// the largest head_dim). Called once at backend creation, not per launch, so that launches
// inside a CUDA graph capture make no function-attribute calls.
cudaError_t allow_attention_shared_memory(size_t bytes);

// `workspace` holds the plan's workspace_floats floats (unused when plan.num_splits == 1).
cudaError_t paged_attention(Matrix q, const Batch& batch, const KvPool& cache, int layer,
                            int num_heads, float scale, const AttentionLaunch& plan,
                            float* workspace, Matrix out, unsigned* error_word,
                            cudaStream_t stream);

}  // namespace pdserve::cuda
