// Operands of the CPU paged attention as the instruction-set-specific kernel files see them
// (plain data, no inline code: see linear_problem.h for why). The pool's layout is KvLayout, of
// which those files call only the static index functions (kv_slot, kv_element), never a member.
#pragma once

#include <cstdint>

#include "common/core/kv_layout.h"

namespace pdserve {

// The most query rows (tokens x heads of one KV head) one tile may hold, and the head
// dimensions the AVX-512 kernels take.
constexpr int kMaxAttentionTileRows = 32;
constexpr int kMaxVectorHeadDim = 256;

struct AttentionProblem {
  const float* q = nullptr;  // [tokens][heads * head_dim], row stride q_stride
  int64_t q_stride = 0;
  float* out = nullptr;  // same shape as q
  int64_t out_stride = 0;
  // This layer's K and V of the pool: layer 0 of `layout` from there, so that the kernels'
  // indices leave out the layer term (the same arithmetic as an index into one layer).
  const void* k = nullptr;
  const void* v = nullptr;
  KvLayout layout;
  int group = 0;         // query heads per KV head
  float scale = 1.0f;    // of the scores (softmax scale times an FP8 pool's k_scale)
  float v_scale = 1.0f;  // of the output (an FP8 pool's v_scale)
  const int32_t* block_tables = nullptr;  // [seqs][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* positions = nullptr;  // [tokens]
};

// Query rows of one tile: tokens [first_token, first_token + num_tokens) of sequence `seq`
// (consecutive positions) x heads [first_head, first_head + num_heads) of KV head kv_head's
// group; num_tokens * num_heads <= kMaxAttentionTileRows.
struct AttentionTile {
  int seq = 0;
  int kv_head = 0;
  int first_head = 0;  // index within the group
  int num_heads = 0;
  int first_token = 0;
  int num_tokens = 0;
};

// head_dim must be a multiple of 32 and at most kMaxVectorHeadDim.
void attend_tile_avx512(const AttentionProblem& problem, const AttentionTile& tile);
// As attend_tile_avx512, but scores over a bf16 KV cache use vdpbf16ps (q rounded to bf16).
void attend_tile_avx512_bf16(const AttentionProblem& problem, const AttentionTile& tile);

}  // namespace pdserve
