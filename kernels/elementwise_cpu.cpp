#include <cmath>
#include <cstring>
#include <string>

#include "common/core/dtype.h"
#include "kernels/cpu_kernels.h"
#include "kernels/row_ops_avx512.h"

namespace pdserve::cpu {

Status embedding(MatrixView table, const int32_t* ids, MatrixView out, CpuThreadPool& pool) {
  for (int64_t i = 0; i < out.rows; ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows) {
      return invalid_argument("embedding: token id " + std::to_string(ids[i]) +
                              " outside the vocabulary of " + std::to_string(table.rows));
    }
  }
  const size_t row_bytes = static_cast<size_t>(table.row_stride) * dtype_size(table.dtype);
  pool.run(out.rows, [&](int64_t i) {
    const void* src = static_cast<const std::byte*>(table.data) + ids[i] * row_bytes;
    convert_elements(src, table.dtype, out.row<float>(i), DType::kF32,
                     static_cast<size_t>(table.cols));
  });
  return {};
}

Status silu_mul(MatrixView gate, MatrixView up, MatrixView out, CpuThreadPool& pool, CpuIsa isa) {
  const bool vector = uses_avx512(isa);
  pool.run(out.rows, [&](int64_t i) {
    const float* g = gate.row<float>(i);
    const float* u = up.row<float>(i);
    float* o = out.row<float>(i);
    if (vector) {
      avx512::silu_mul_row(g, u, o, out.cols);
    } else {
      for (int64_t j = 0; j < out.cols; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  });
  return {};
}

Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out) {
  for (int64_t i = 0; i < out.rows; ++i) {
    if (indices[i] < 0 || indices[i] >= in.rows) {
      return invalid_argument("gather_rows: index " + std::to_string(indices[i]) + " outside " +
                              std::to_string(in.rows) + " rows");
    }
    std::memcpy(out.row<float>(i), in.row<float>(indices[i]),
                static_cast<size_t>(in.cols) * sizeof(float));
  }
  return {};
}

}  // namespace pdserve::cpu
