// pdserve-bench-gpu's weights: constant values in a Qwen3 config's shapes (throughput does not
// depend on them), bf16 or FP8 in Qwen's block format (E4M3 codes with one float scale per
// 128 x 128 block, as the "-FP8" checkpoints hold). Both mean the same numbers: every
// projection weight is bf16(0.01) (FP8: code 1.0 times a scale of bf16(0.01)), every norm 1.
// Buffers are shared between layers, so building the 8B shape allocates one layer's worth.
#pragma once

#include <cstdint>

#include "common/model/model_config.h"
#include "common/model/qwen3_weights.h"

namespace pdserve {

enum class BenchWeights { kBF16, kFp8 };

const char* bench_weights_name(BenchWeights weights);

// The config as the model should see it: with kFp8, quantization set to 128 x 128 blocks (so
// that qwen3_weight_bytes and the loader's checks count one byte a projection weight).
ModelConfig bench_config(ModelConfig config, BenchWeights weights);

// Weights for bench_config(config, weights); an untied lm_head gets its own buffer, so the
// model keeps two device copies as a real untied checkpoint does.
Qwen3Weights constant_qwen3_weights(const ModelConfig& config, BenchWeights weights);

// One rows x cols projection of the same constants, in buffers of its own (the GEMM peaks).
HostTensor constant_projection(BenchWeights weights, int64_t rows, int64_t cols);

}  // namespace pdserve
