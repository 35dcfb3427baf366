#include "kernels/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/cuda_attention_plan.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_kernels.h"
#include "kernels/fp8_linear_plan.h"
#include "kernels/linear_cuda.h"
#include "kernels/linear_fp8_cuda.h"
#include "kernels/op_checks.h"

namespace pdserve {
namespace {

// What cuBLAS recommends for Hopper (and more than enough for Ampere).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// The kernels are instantiated per element type: the views of one call share one of them.
Status require_activations(std::initializer_list<MatrixView> views, const char* op) {
  const DType dtype = views.begin()->dtype;
  for (const MatrixView& m : views) {
    if (m.dtype != dtype || (dtype != DType::kBF16 && dtype != DType::kF32)) {
      std::string names;
      for (const MatrixView& each : views) {
        names += (names.empty() ? "" : ", ") + std::string(dtype_name(each.dtype));
      }
      return unimplemented(std::string(op) +
                           " (cuda): the activations of one call must all be bfloat16 or all "
                           "float32, not " +
                           names);
    }
  }
  return {};
}

cuda::Matrix dev(MatrixView m) {
  return {m.data, m.dtype, m.rows, m.cols, m.row_stride};
}
cuda::Vector dev(VectorView v) {
  return {v.data, v.dtype, v.size};
}

cuda::KvPool dev(const KvCacheView& c, int layer) {
  return {c.k, c.v, c.layout, c.k_scale(layer), c.v_scale(layer)};
}

cuda::Batch dev(const AttentionBatch& b) {
  return {b.num_seqs,     b.num_tokens,   b.max_blocks_per_seq, b.query_start,
          b.context_lens, b.block_tables, b.positions,          b.slot_mapping};
}

cuda::RopeArgs dev(const QkNormRopeParams& p) {
  return {dev(p.q_norm_weight), dev(p.k_norm_weight), p.rms_norm_eps, p.rope_theta,
          p.num_heads,          p.num_kv_heads,       p.head_dim};
}

cuda::AttentionLaunch dev(const AttentionPlan& p) {
  return {p.group, p.num_splits, p.keys_per_split, p.grid_x, p.shared_bytes};
}

std::string describe_device_errors(unsigned bits) {
  std::string text;
  const auto add = [&](unsigned bit, const char* what) {
    if ((bits & bit) == 0) return;
    if (!text.empty()) text += ", ";
    text += what;
  };
  add(cuda::kTokenIdOutOfRange, "a token id outside the vocabulary (embedding)");
  add(cuda::kKvSlotOutOfRange, "a KV slot or position outside the pool (qk_norm_rope_kv_write)");
  add(cuda::kBlockIdOutOfRange, "a block id outside the pool (paged_attention)");
  add(cuda::kRowIndexOutOfRange, "a row index outside the input (gather_rows)");
  return text;
}

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override {
    // Errors cannot be reported from a destructor; the device is being let go anyway.
    if (stream_ != nullptr) static_cast<void>(cudaStreamSynchronize(stream_));
    if (workspace_.data != nullptr) static_cast<void>(cudaFree(workspace_.data));
    if (fp8_workspace_.data != nullptr) static_cast<void>(cudaFree(fp8_workspace_.data));
    for (void* retired : retired_workspaces_) static_cast<void>(cudaFree(retired));
    if (cublas_lt_ != nullptr) static_cast<void>(cublasLtDestroy(cublas_lt_));
    if (cublas_workspace_ != nullptr) static_cast<void>(cudaFree(cublas_workspace_));
    if (error_word_ != nullptr) static_cast<void>(cudaFree(error_word_));
    for (cudaEvent_t marker : markers_) {
      if (marker != nullptr) static_cast<void>(cudaEventDestroy(marker));
    }
    if (host_error_word_ != nullptr) static_cast<void>(cudaFreeHost(host_error_word_));
    if (cublas_ != nullptr) static_cast<void>(cublasDestroy(cublas_));
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
  }

  static Result<std::unique_ptr<Backend>> create(int device_index, DType activation_dtype) {
    if (activation_dtype != DType::kBF16 && activation_dtype != DType::kF32) {
      return invalid_argument("the CUDA backend computes in bfloat16 or float32, not " +
                              std::string(dtype_name(activation_dtype)));
    }
    std::unique_ptr<CudaBackend> backend(new CudaBackend(device_index, activation_dtype));
    PDS_RETURN_IF_ERROR(backend->init());
    return std::unique_ptr<Backend>(std::move(backend));
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string description() const override { return description_; }
  DType activation_dtype() const override { return activation_dtype_; }
  bool shares_host_memory() const override { return false; }

  cudaStream_t stream() const { return stream_; }
  int multiprocessors() const { return multiprocessors_; }

  Result<DeviceBuffer> allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t error = cudaMalloc(&data, bytes == 0 ? 1 : bytes);
    if (error != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // not sticky: clear it for the next call
      return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes on " +
                                description_ + ": " + cudaGetErrorString(error));
    }
    return DeviceBuffer(this, data, bytes);
  }
  void release(void* data) noexcept override { static_cast<void>(cudaFree(data)); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    // Pageable sources are staged before the call returns, so the caller may reuse them.
    PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    return {};
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    PDS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return {};
  }
  Status synchronize() override {
    // The error word comes back with the queued work: one wait per step.
    PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_error_word_, error_word_, sizeof(unsigned),
                                             cudaMemcpyDeviceToHost, stream_));
    PDS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const unsigned bits = *host_error_word_;
    if (bits != 0) {
      PDS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_word_, 0, sizeof(unsigned), stream_));
      return invalid_argument("cuda kernels met " + describe_device_errors(bits) +
                              "; the outputs of this step are not valid");
    }
    return {};
  }

  // Markers are events on the stream, created at first use (never during a capture: the
  // forward records them only for a step with a layer observer, which is not captured).
  Status record_marker(int marker) override {
    if (marker < 0 || marker >= kMaxMarkers) {
      return invalid_argument("record_marker: marker " + std::to_string(marker) + " out of range");
    }
    if (markers_.size() <= static_cast<size_t>(marker)) markers_.resize(marker + 1, nullptr);
    cudaEvent_t& event = markers_[static_cast<size_t>(marker)];
    if (event == nullptr) {
      PDS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    PDS_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream_));
    return {};
  }
  Result<bool> marker_reached(int marker) override {
    if (marker < 0 || static_cast<size_t>(marker) >= markers_.size() ||
        markers_[static_cast<size_t>(marker)] == nullptr) {
      return true;  // never recorded: nothing to wait for
    }
    const cudaError_t state = cudaEventQuery(markers_[static_cast<size_t>(marker)]);
    if (state == cudaErrorNotReady) return false;
    PDS_CUDA_RETURN_IF_ERROR(state);
    return true;
  }
  Result<HostBuffer> allocate_host(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t error = cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (error != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return resource_exhausted("cannot allocate " + std::to_string(bytes) +
                                " bytes of page-locked host memory: " + cudaGetErrorString(error));
    }
    return HostBuffer(this, data, bytes);
  }
  void release_host(void* data) noexcept override { static_cast<void>(cudaFreeHost(data)); }
  Status bind_current_thread() override {
    PDS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index_));
    return {};
  }

  Status embedding(MatrixView table, const int32_t* ids, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_embedding(table, out));
    PDS_RETURN_IF_ERROR(require_activations({table, out}, "embedding"));
    PDS_CUDA_RETURN_IF_ERROR(cuda::embedding(dev(table), ids, dev(out), error_word_, stream_));
    return {};
  }
  Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_rms_norm(in, weight, out));
    PDS_RETURN_IF_ERROR(require_activations({in, out}, "rms_norm"));
    PDS_CUDA_RETURN_IF_ERROR(cuda::rms_norm(dev(in), {}, {}, dev(weight), eps, dev(out), stream_));
    return {};
  }
  Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps) override {
    PDS_RETURN_IF_ERROR(check_rms_norm(x, weight, residual));
    PDS_RETURN_IF_ERROR(require_activations({x, residual}, "add_rms_norm"));
    PDS_CUDA_RETURN_IF_ERROR(
        cuda::rms_norm(dev(residual), dev(x), dev(residual), dev(weight), eps, dev(x), stream_));
    return {};
  }
  Status linear(MatrixView in, MatrixView weight, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_linear(in, weight, out));
    if (weight.dtype == DType::kF8E4M3) return linear_fp8(in, weight, out);
    return linear_cuda(cublas_, in, weight, out);
  }
  Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                               const QkNormRopeParams& params, const AttentionBatch& batch,
                               const KvCacheView& cache, int layer) override {
    PDS_RETURN_IF_ERROR(check_qk_norm_rope(q, k, v, params, batch, cache, layer));
    PDS_RETURN_IF_ERROR(require_activations({q, k, v}, "qk_norm_rope"));
    PDS_RETURN_IF_ERROR(require_kv_dtype(cache));
    PDS_CUDA_RETURN_IF_ERROR(cuda::qk_norm_rope_kv_write(dev(q), dev(k), dev(v), dev(params),
                                                         dev(batch), dev(cache, layer), layer,
                                                         error_word_, stream_));
    return {};
  }
  Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                         int layer, int num_heads, float scale, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_attention(q, batch, cache, layer, num_heads, out));
    PDS_RETURN_IF_ERROR(require_activations({q, out}, "paged_attention"));
    PDS_RETURN_IF_ERROR(require_kv_dtype(cache));
    if (batch.num_tokens == 0) return {};
    AttentionShape shape;
    shape.num_seqs = batch.num_seqs;
    shape.num_tokens = batch.num_tokens;
    shape.max_query_len = batch.max_query_len;
    shape.max_context_len = batch.max_context_len;
    shape.num_heads = num_heads;
    shape.num_kv_heads = cache.layout.num_kv_heads;
    shape.head_dim = cache.layout.head_dim;
    PDS_ASSIGN_OR_RETURN(AttentionPlan plan, plan_paged_attention(shape, multiprocessors_));
    PDS_RETURN_IF_ERROR(reserve(workspace_, plan.workspace_floats * sizeof(float),
                                "paged_attention (cuda): the split-K workspace"));
    PDS_CUDA_RETURN_IF_ERROR(cuda::paged_attention(
        dev(q), dev(batch), dev(cache, layer), layer, num_heads, scale, dev(plan),
        static_cast<float*>(workspace_.data), dev(out), error_word_, stream_));
    return {};
  }
  Status silu_mul(MatrixView gate, MatrixView up, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_same_shape(gate, up, "silu_mul"));
    PDS_RETURN_IF_ERROR(check_same_shape(gate, out, "silu_mul"));
    PDS_RETURN_IF_ERROR(require_activations({gate, up, out}, "silu_mul"));
    PDS_CUDA_RETURN_IF_ERROR(cuda::silu_mul(dev(gate), dev(up), dev(out), stream_));
    return {};
  }
  Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out) override {
    if (in.cols != out.cols) return invalid_argument("gather_rows: width mismatch");
    PDS_RETURN_IF_ERROR(require_activations({in, out}, "gather_rows"));
    PDS_CUDA_RETURN_IF_ERROR(cuda::gather_rows(dev(in), indices, dev(out), error_word_, stream_));
    return {};
  }

 private:
  // A device buffer that only grows (never during a graph capture: see reserve()).
  struct GrowingBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };

  // FP8 weights (fp8_linear_plan.h): the path for this device and weight, its workspace.
  Status linear_fp8(MatrixView in, MatrixView weight, MatrixView out) {
    PDS_RETURN_IF_ERROR(require_activations({in}, "linear"));
    const Fp8WeightShape shape{weight.rows, weight.cols, weight.scale_block_n,
                               weight.scale_block_k};
    const Fp8GemmPath path = choose_fp8_gemm_path(shape, fp8_device_, in.dtype, out.dtype).path;
    const Fp8Workspace plan = plan_fp8_workspace(path, shape, in.rows, in.dtype);
    PDS_RETURN_IF_ERROR(reserve(fp8_workspace_, plan.bytes, "linear (cuda): the FP8 workspace"));
    // cuBLASLt shares cuBLAS's workspace: both run on this one stream, one call at a time.
    const CudaFp8Context context{cublas_, cublas_lt_, stream_, cublas_workspace_,
                                 kCublasWorkspaceBytes};
    return linear_fp8_cuda(context, path, in, {weight.data, weight.row_stride, shape, weight.scale},
                           out, fp8_workspace_.data);
  }

  CudaBackend(int device_index, DType activation_dtype)
      : device_index_(device_index), activation_dtype_(activation_dtype) {}

  Status init() {
    PDS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index_));
    cudaDeviceProp properties{};
    PDS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device_index_));
    if (properties.major < 8) {
      return unavailable("--device cuda: device " + std::to_string(device_index_) + " (" +
                         properties.name + ") has compute capability " +
                         std::to_string(properties.major) + "." + std::to_string(properties.minor) +
                         "; bfloat16 kernels need 8.0+");
    }
    multiprocessors_ = properties.multiProcessorCount;
    description_ = "cuda:" + std::to_string(device_index_) + " (" + properties.name + ", " +
                   std::to_string(properties.totalGlobalMem >> 20) + " MiB, " +
                   (activation_dtype_ == DType::kF32 ? "strict float32" : "bfloat16") + ")";
    PDS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PDS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
    PDS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
    PDS_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublas_lt_));
    fp8_device_ = {properties.major, properties.minor, cublasLtGetVersion()};
    if (activation_dtype_ == DType::kF32) {
      // Strict float32: no TF32 (even under NVIDIA_TF32_OVERRIDE) and no reduced-precision
      // reductions anywhere in the handle; linear_cuda also asks for pedantic compute.
      PDS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
          cublas_, static_cast<cublasMath_t>(CUBLAS_PEDANTIC_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    }
    // A fixed cuBLAS workspace (set after the stream, which resets it) so that GEMMs never
    // allocate, which CUDA graph capture requires.
    PDS_CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    PDS_CUBLAS_RETURN_IF_ERROR(
        cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    AttentionShape widest;  // the largest head_dim the kernel takes sets the shared memory
    widest.num_seqs = widest.num_tokens = widest.max_query_len = widest.max_context_len = 1;
    widest.num_heads = widest.num_kv_heads = 1;
    widest.head_dim = kAttentionMaxHeadDim;
    PDS_ASSIGN_OR_RETURN(AttentionPlan widest_plan, plan_paged_attention(widest, 1));
    PDS_CUDA_RETURN_IF_ERROR(cuda::allow_attention_shared_memory(widest_plan.shared_bytes));
    PDS_CUDA_RETURN_IF_ERROR(cudaMalloc(&error_word_, sizeof(unsigned)));
    PDS_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&host_error_word_, sizeof(unsigned), cudaHostAllocDefault));
    PDS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_word_, 0, sizeof(unsigned), stream_));
    return synchronize();
  }

  static Status require_kv_dtype(const KvCacheView& cache) {
    if (cache.layout.dtype != DType::kBF16 && cache.layout.dtype != DType::kF32 &&
        cache.layout.dtype != DType::kF8E4M3) {
      return unimplemented("cuda: the KV cache must be bfloat16, float32 or fp8 (e4m3)");
    }
    return {};
  }

  // Grows `buffer` to `bytes`; never while a graph is being captured (allocation would break
  // the capture), so graphs must be captured after an eager step of the same shape. The
  // outgrown buffer is kept until the backend goes: captured graphs may still use it.
  Status reserve(GrowingBuffer& buffer, size_t bytes, const char* what) {
    if (bytes <= buffer.bytes) return {};
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PDS_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      return failed_precondition(std::string(what) + " must grow to " + std::to_string(bytes) +
                                 " bytes during graph capture; run the shape eagerly first");
    }
    if (buffer.data != nullptr) retired_workspaces_.push_back(buffer.data);
    buffer = {};
    PDS_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.data, bytes));
    buffer.bytes = bytes;
    return {};
  }

  int device_index_;
  DType activation_dtype_;
  int multiprocessors_ = 0;
  std::string description_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  unsigned* error_word_ = nullptr;
  unsigned* host_error_word_ = nullptr;  // page-locked: synchronize() reads the word back
  GrowingBuffer workspace_;              // paged attention's split-K partials
  GrowingBuffer fp8_workspace_;  // FP8 linear: quantized activations and scales, or a scratch
  std::vector<void*> retired_workspaces_;
  cublasLtHandle_t cublas_lt_ = nullptr;
  Fp8Device fp8_device_;
  void* cublas_workspace_ = nullptr;
  std::vector<cudaEvent_t> markers_;  // record_marker's events, by marker
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index, DType activation_dtype) {
  return CudaBackend::create(device_index, activation_dtype);
}

Result<cudaStream_t> cuda_stream_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return invalid_argument("not a CUDA backend: " + backend.description());
  return cuda->stream();
}

Result<CudaMemoryInfo> cuda_memory_info(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return invalid_argument("not a CUDA backend: " + backend.description());
  CudaMemoryInfo info;
  PDS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  info.multiprocessors = cuda->multiprocessors();
  return info;
}

}  // namespace pdserve
