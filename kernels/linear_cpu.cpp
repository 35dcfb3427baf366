#include "kernels/linear_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/core/dtype.h"

namespace pdserve {
namespace {

// Weight rows handled together so that their block stays in L2 while every activation row
// streams past it.
constexpr int64_t kColumnBlock = 48;
// The AVX-512 kernels' weight block for a batch (within the 1 MiB L2 of current cores), and
// how a lone activation row's weights are shared out.
constexpr int64_t kWeightBlockBytes = 384 * 1024;
constexpr int64_t kGemvItemsPerThread = 8;
constexpr int64_t kGemvMinColumns = 64;

// Bytes per weight of the block a batch keeps in L2: FP8 codes from kFp8DecodeOnceMinRows rows
// on are held decoded (bf16 at avx512_bf16, float32 in the avx2 kernel the avx512 level runs).
int64_t weight_block_element_bytes(const LinearProblem& p, CpuIsa isa) {
  if (p.w_dtype != DType::kF8E4M3 || p.m < kFp8DecodeOnceMinRows) {
    return static_cast<int64_t>(dtype_size(p.w_dtype));
  }
  return isa == CpuIsa::kAvx512Bf16 ? 2 : 4;
}

// Columns per block. A lone activation row (decode) reads every weight once from memory: each
// thread gets about kGemvItemsPerThread long contiguous blocks, so that its stream (and the
// kernels' next-tile prefetch) stays sequential (64-column blocks handed out alternately made
// two threads read slower than one). A batch gets blocks of about kWeightBlockBytes of
// weights, as many as a multiple of the thread count so that no thread waits for another's
// last block; multiples of 24 columns (the tiles are 6 and 8 wide) except the last. Only the
// speed depends on this: each element's order does not.
int64_t column_block(const LinearProblem& p, CpuIsa isa, int num_threads) {
  if (isa != CpuIsa::kAvx512 && isa != CpuIsa::kAvx512Bf16) return kColumnBlock;
  if (p.m == 1) {
    const int64_t items = num_threads * kGemvItemsPerThread;
    int64_t rows = std::max(kGemvMinColumns, ((p.n + items - 1) / items + 7) / 8 * 8);
    if (p.k > kLinearActivationChunk) rows = std::min(rows, kMaxLinearColumnBlock);
    return rows;
  }
  const int64_t row_bytes = std::max<int64_t>(1, p.k * weight_block_element_bytes(p, isa));
  const int64_t budget_rows =
      std::clamp<int64_t>(kWeightBlockBytes / row_bytes, 24, kMaxLinearColumnBlock);
  int64_t blocks = (p.n + budget_rows - 1) / budget_rows;
  blocks = (blocks + num_threads - 1) / num_threads * num_threads;
  const int64_t rows = (p.n + blocks - 1) / blocks;
  return std::min<int64_t>(kMaxLinearColumnBlock, (rows + 23) / 24 * 24);
}

// Per-thread buffers (the kernel files, compiled for their instruction sets, instantiate no
// library code), grown to the largest problem seen and then reused by every call.
template <typename T>
T* thread_buffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

void fp8_columns(const LinearProblem& p, int64_t begin, int64_t end, CpuIsa isa) {
  const bool decode_once = p.m >= kFp8DecodeOnceMinRows;
  switch (isa) {
    case CpuIsa::kAvx512Bf16: {
      thread_local std::vector<uint16_t> activations, decoded;
      const int64_t row = fp8_activation_row(p.k, p.scale_block_k);
      linear_cpu_fp8_columns_avx512_bf16(
          p, begin, end, thread_buffer(activations, kLinearRowTile * row),
          decode_once ? thread_buffer(decoded, (end - begin) * row) : nullptr);
      return;
    }
    case CpuIsa::kAvx512:  // no bf16 dot products: the float32 products of the AVX2 kernel
    case CpuIsa::kAvx2: {
      thread_local std::vector<float> decoded;
      linear_cpu_fp8_columns_avx2(
          p, begin, end,
          decode_once ? thread_buffer(decoded, (end - begin) * fp8_decoded_row_avx2(p.k))
                      : nullptr);
      return;
    }
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      linear_cpu_fp8_columns_portable(p, begin, end);
      return;
  }
}

void columns(const LinearProblem& p, int64_t begin, int64_t end, CpuIsa isa) {
  if (p.w_dtype == DType::kF8E4M3) {
    fp8_columns(p, begin, end, isa);
    return;
  }
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      if (p.w_dtype == DType::kBF16) {
        linear_cpu_columns_avx512_bf16(p, begin, end);
        return;
      }
      linear_cpu_columns_avx512(p, begin, end);  // the level's float32 products for f16/f32
      return;
    case CpuIsa::kAvx512:
      linear_cpu_columns_avx512(p, begin, end);
      return;
    case CpuIsa::kAvx2:
      linear_cpu_columns_avx2(p, begin, end);
      return;
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      linear_cpu_columns_portable(p, begin, end);
      return;
  }
}

}  // namespace

// The reference order that the AVX2 kernel reproduces lane for lane.
void linear_cpu_columns_portable(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  const int64_t k_vec = p.k - p.k % 8;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = p.x + i * p.x_stride;
    for (int64_t j = n_begin; j < n_end; ++j) {
      const int64_t w_row = j * p.w_stride;
      float lanes[8] = {};
      for (int64_t kk = 0; kk < k_vec; kk += 8) {
        for (int l = 0; l < 8; ++l) {
          lanes[l] = std::fma(x[kk + l],
                              load_as_float(p.w, p.w_dtype, static_cast<size_t>(w_row + kk + l)),
                              lanes[l]);
        }
      }
      float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                  ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      for (int64_t kk = k_vec; kk < p.k; ++kk) {
        sum = std::fma(x[kk], load_as_float(p.w, p.w_dtype, static_cast<size_t>(w_row + kk)), sum);
      }
      p.y[i * p.y_stride + j] = sum;
    }
  }
}

Status linear_cpu(const LinearProblem& p, CpuThreadPool& pool, CpuIsa isa) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return invalid_argument("linear: negative dimension");
  if (p.m == 0 || p.n == 0) return {};
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) {
    return invalid_argument("linear: null operand");
  }
  if (p.w_dtype == DType::kF8E4M3 &&
      (p.w_scale == nullptr || p.scale_block_n <= 0 || p.scale_block_k <= 0)) {
    return invalid_argument("linear: FP8 weights without scales");
  }
  if (isa == CpuIsa::kAuto || !cpu_supports(isa)) {
    return invalid_argument("linear: instruction-set level " + std::string(cpu_isa_name(isa)) +
                            " is not a level this CPU runs");
  }
  const int64_t block_columns = column_block(p, isa, pool.num_threads());
  const int64_t num_blocks = (p.n + block_columns - 1) / block_columns;
  pool.run(num_blocks, [&](int64_t block) {
    const int64_t begin = block * block_columns;
    columns(p, begin, std::min(p.n, begin + block_columns), isa);
  });
  return {};
}

}  // namespace pdserve
