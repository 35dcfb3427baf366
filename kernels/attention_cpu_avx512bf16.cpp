// The avx512_bf16 level of the paged attention over a bf16 KV cache (scores with vdpbf16ps);
// see attention_cpu_avx512.inc.
#define PDS_ATTENTION_BF16_DOT 1
#include "kernels/attention_cpu_avx512.inc"

namespace pdserve {

void attend_tile_avx512_bf16(const AttentionProblem& problem, const AttentionTile& tile) {
  attend_tile(problem, tile);
}

}  // namespace pdserve
