// Launcher of the CUDA sampling kernel (sampling_cuda.cu): one thread block per row samples
// a token from the row's float logits, in place, by the algorithm of sampling_rows.h. Pointers,
// sizes and a stream; never allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sampling_rows.h"

namespace pdserve::cuda {

struct SampleRowsArgs {
  float* logits = nullptr;  // rows of `vocab` floats, `logits_stride` apart; overwritten
  int64_t logits_stride = 0;
  int vocab = 0;
  const sampling::RowArgs* rows = nullptr;
  int num_rows = 0;
  const int32_t* lists = nullptr;  // the rows' list area
  // Grammar masks: mask_index[row] is the row's mask in `masks` (mask_words each) or -1;
  // mask_index null: no row has one.
  const int32_t* mask_index = nullptr;
  const int32_t* masks = nullptr;
  int mask_words = 0;
  sampling::RowResult* results = nullptr;  // [num_rows]
};

cudaError_t sample_rows(const SampleRowsArgs& args, cudaStream_t stream);

}  // namespace pdserve::cuda
