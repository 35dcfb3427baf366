// How pdserve-bench-gpu sizes its KV pool: from the device's free memory once the model is
// placed, less a reserve for the forward workspaces and what the runner allocates, never from
// fixed defaults (which asked for 120-155 GB at batch 256 for the 8B shape). Decode sequences
// hold only their context and the prefill prompt reuses the same blocks, so the pool is what
// the largest batch that fits needs, plus the decode graphs' scratch block (the pool's last
// block, as Qwen3ModelRunner holds it back). Pure arithmetic, tested without a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

struct BenchKvInputs {
  size_t free_bytes = 0;     // device memory free once the weights are placed
  size_t reserve_bytes = 0;  // left free for the workspaces, cuBLAS, split-K and graph pools
  size_t block_bytes = 0;    // K and V of one block across all layers
  int block_size = 0;        // tokens per block
  int context = 0;           // cached tokens per decoding sequence (it decodes one more)
  int prompt = 0;            // prefill prompt length
  std::vector<int> batches;  // decode batch sizes asked for
};

struct BenchKvPlan {
  int decode_blocks_per_seq = 0;  // ceil((context + 1) / block_size)
  int prefill_blocks = 0;         // ceil(prompt / block_size)
  int num_blocks = 0;             // the pool: the largest need that fits, plus the scratch block
  int scratch_block = 0;          // the last block: padding sequences of the decode graphs
  std::vector<int> batches;       // those asked for that fit, in the order asked
  std::vector<int> skipped;       // those that do not fit
};

// InvalidArgument for inconsistent inputs; ResourceExhausted (with the GiB figures) when the
// prefill prompt or no batch at all fits.
Result<BenchKvPlan> plan_bench_kv(const BenchKvInputs& inputs);

}  // namespace pdserve
