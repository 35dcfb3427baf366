// The avx512 level of the paged attention (float32 scores); see attention_cpu_avx512.inc.
#define PDS_ATTENTION_BF16_DOT 0
#include "kernels/attention_cpu_avx512.inc"

namespace pdserve {

void attend_tile_avx512(const AttentionProblem& problem, const AttentionTile& tile) {
  attend_tile(problem, tile);
}

}  // namespace pdserve
