#include "kernels/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common/model/host_buffer.h"
#include "kernels/cpu_kernels.h"
#include "kernels/linear_cpu.h"
#include "kernels/op_checks.h"

namespace pdserve {
namespace {

Status require_f32(MatrixView m, const char* op) {
  if (m.dtype != DType::kF32) {
    return unimplemented(std::string(op) + ": the CPU backend computes activations in float32");
  }
  return {};
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, CpuIsa isa)
      : num_threads_(num_threads), isa_(isa), pool_(num_threads) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string description() const override {
    return "cpu (" + std::to_string(num_threads_) + " threads, " + std::string(cpu_isa_name(isa_)) +
           ")";
  }
  CpuIsa isa() const { return isa_; }

  DType activation_dtype() const override { return DType::kF32; }
  // bf16 where the arithmetic is bf16-class anyway: bf16 weights at the avx512_bf16 level (its
  // goldens' tolerance covers a bf16 cache: kernels/README.md). Float32 weights (the reference
  // the CUDA strict float32 mode is compared with) and the float32 levels keep float32.
  DType default_kv_dtype(DType weight_dtype) const override {
    return isa_ == CpuIsa::kAvx512Bf16 && weight_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  }
  bool shares_host_memory() const override { return true; }

  // Cache-line aligned, so vector loads never straddle lines at row starts; large buffers (the
  // KV pool) on transparent huge pages: attention reads the pool's blocks at scattered places.
  Result<DeviceBuffer> allocate(size_t bytes) override {
    void* data = allocate_huge_page_aligned(bytes);
    if (data == nullptr) {
      return resource_exhausted("cannot allocate " + std::to_string(bytes) +
                                " bytes of host memory");
    }
    return DeviceBuffer(this, data, bytes);
  }
  void release(void* data) noexcept override { std::free(data); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  Status synchronize() override { return {}; }

  Status embedding(MatrixView table, const int32_t* ids, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_embedding(table, out));
    PDS_RETURN_IF_ERROR(require_f32(out, "embedding"));
    return cpu::embedding(table, ids, out, pool_);
  }
  Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_rms_norm(in, weight, out));
    PDS_RETURN_IF_ERROR(require_f32(in, "rms_norm"));
    PDS_RETURN_IF_ERROR(require_f32(out, "rms_norm"));
    return cpu::rms_norm(in, weight, eps, out, pool_, isa_);
  }
  Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps) override {
    PDS_RETURN_IF_ERROR(check_rms_norm(x, weight, residual));
    PDS_RETURN_IF_ERROR(require_f32(x, "add_rms_norm"));
    PDS_RETURN_IF_ERROR(require_f32(residual, "add_rms_norm"));
    return cpu::add_rms_norm(x, residual, weight, eps, pool_, isa_);
  }
  Status linear(MatrixView in, MatrixView weight, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_linear(in, weight, out));
    PDS_RETURN_IF_ERROR(require_f32(in, "linear"));
    PDS_RETURN_IF_ERROR(require_f32(out, "linear"));
    LinearProblem problem;
    problem.x = static_cast<const float*>(in.data);
    problem.x_stride = in.row_stride;
    problem.w = weight.data;
    problem.w_dtype = weight.dtype;
    problem.w_stride = weight.row_stride;
    problem.w_scale = weight.scale;
    problem.scale_block_n = weight.scale_block_n;
    problem.scale_block_k = weight.scale_block_k;
    problem.y = static_cast<float*>(out.data);
    problem.y_stride = out.row_stride;
    problem.m = in.rows;
    problem.n = weight.rows;
    problem.k = in.cols;
    return linear_cpu(problem, pool_, isa_);
  }
  Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                               const QkNormRopeParams& params, const AttentionBatch& batch,
                               const KvCacheView& cache, int layer) override {
    PDS_RETURN_IF_ERROR(check_qk_norm_rope(q, k, v, params, batch, cache, layer));
    PDS_RETURN_IF_ERROR(require_f32(q, "qk_norm_rope"));
    PDS_RETURN_IF_ERROR(require_f32(k, "qk_norm_rope"));
    PDS_RETURN_IF_ERROR(require_f32(v, "qk_norm_rope"));
    return cpu::qk_norm_rope_kv_write(q, k, v, params, batch, cache, layer, pool_, isa_);
  }
  Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                         int layer, int num_heads, float scale, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_attention(q, batch, cache, layer, num_heads, out));
    PDS_RETURN_IF_ERROR(require_f32(q, "paged_attention"));
    return cpu::paged_attention(q, batch, cache, layer, num_heads, scale, out, pool_, isa_);
  }
  Status silu_mul(MatrixView gate, MatrixView up, MatrixView out) override {
    PDS_RETURN_IF_ERROR(check_same_shape(gate, up, "silu_mul"));
    PDS_RETURN_IF_ERROR(check_same_shape(gate, out, "silu_mul"));
    PDS_RETURN_IF_ERROR(require_f32(out, "silu_mul"));
    return cpu::silu_mul(gate, up, out, pool_, isa_);
  }
  Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out) override {
    if (in.cols != out.cols) return invalid_argument("gather_rows: width mismatch");
    PDS_RETURN_IF_ERROR(require_f32(in, "gather_rows"));
    return cpu::gather_rows(in, indices, out);
  }

 private:
  int num_threads_;
  CpuIsa isa_;
  CpuThreadPool pool_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend(int num_threads, CpuIsa isa) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  PDS_ASSIGN_OR_RETURN(const CpuIsa level, resolve_cpu_isa(isa));
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(num_threads, level));
}

CpuIsa cpu_backend_isa(const Backend& backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  return cpu == nullptr ? CpuIsa::kAuto : cpu->isa();
}

}  // namespace pdserve
