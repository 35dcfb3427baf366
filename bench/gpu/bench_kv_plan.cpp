#include "bench/gpu/bench_kv_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace pdserve {
namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", bytes / (1ull << 30));
  return text;
}

int blocks_for(int tokens, int block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace

Result<BenchKvPlan> plan_bench_kv(const BenchKvInputs& in) {
  if (in.block_bytes == 0 || in.block_size <= 0 || in.context <= 0 || in.prompt <= 0 ||
      in.batches.empty() ||
      std::any_of(in.batches.begin(), in.batches.end(), [](int b) { return b <= 0; })) {
    return invalid_argument(
        "bench KV plan: block size, context, prompt and batches must be "
        "positive");
  }
  BenchKvPlan plan;
  plan.decode_blocks_per_seq = blocks_for(in.context + 1, in.block_size);
  plan.prefill_blocks = blocks_for(in.prompt, in.block_size);
  const size_t usable = in.free_bytes > in.reserve_bytes ? in.free_bytes - in.reserve_bytes : 0;
  // One block is the scratch block; the rest is shared by the decode sequences and the prompt.
  const size_t affordable = usable / in.block_bytes;
  if (affordable < static_cast<size_t>(plan.prefill_blocks) + 1) {
    return resource_exhausted("the KV pool does not hold the " + std::to_string(in.prompt) +
                              "-token prompt: " + gib(static_cast<double>(in.free_bytes)) +
                              " free, " + gib(static_cast<double>(in.reserve_bytes)) +
                              " kept in reserve, it needs " +
                              gib(static_cast<double>((plan.prefill_blocks + 1) * in.block_bytes)));
  }
  int most_blocks = plan.prefill_blocks;
  for (int batch : in.batches) {
    const size_t need = static_cast<size_t>(batch) * plan.decode_blocks_per_seq;
    if (need + 1 <= affordable) {
      plan.batches.push_back(batch);
      most_blocks = std::max(most_blocks, static_cast<int>(need));
    } else {
      plan.skipped.push_back(batch);
    }
  }
  if (plan.batches.empty()) {
    return resource_exhausted(
        "no decode batch fits: " + gib(static_cast<double>(usable)) + " usable holds " +
        std::to_string(affordable) + " blocks, batch " + std::to_string(in.batches.front()) +
        " needs " +
        std::to_string(static_cast<size_t>(in.batches.front()) * plan.decode_blocks_per_seq));
  }
  plan.scratch_block = most_blocks;
  plan.num_blocks = most_blocks + 1;
  return plan;
}

}  // namespace pdserve
