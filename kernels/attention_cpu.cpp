#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/attention_problem.h"
#include "kernels/cpu_kernels.h"
#include "kernels/vector_math.h"

namespace pdserve::cpu {
namespace {

constexpr int kMaxHeadDim = 512;
constexpr int kMaxBlockSize = 256;

constexpr int kMaxGroupHeads = 16;
// Sequences whose attention tiles are items of one job (a table of their first items on the
// stack); beyond, each sequence and KV head is one item.
constexpr int kMaxTiledSeqs = 1024;

// Query heads [first_head, first_head + num_heads) of one token, all reading kv_head: each key
// and value vector is loaded once for the whole group. Per head: online softmax over the KV
// blocks in position order. The block boundaries are those of the paged pool (multiples of
// block_size), so the arithmetic for a query position is the same however the prompt was
// chunked or batched, and however many heads are processed together.
//
// The portable and avx2 levels (the two agree bitwise: their dot and axpy do).
template <bool kAvx2>
void attend_heads(const float* q_row, int first_head, int num_heads, const AttentionBatch& batch,
                  const KvCacheView& cache, int layer, int seq, int position, int kv_head,
                  float scale, float* out_row) {
  const auto dot = kAvx2 ? avx2::dot_f32 : portable::dot_f32;
  const auto axpy = kAvx2 ? avx2::axpy_f32 : portable::axpy_f32;
  const KvLayout& layout = cache.layout;
  const int head_dim = layout.head_dim;
  const int block_size = layout.block_size;
  const DType dtype = layout.dtype;
  const int64_t element_bytes = kv_element_bytes(layout);
  // An FP8 pool's scales, applied to the scores and the output rather than to every element.
  const float score_scale = scale * cache.k_scale(layer);
  const float v_scale = cache.v_scale(layer);
  const int32_t* block_table =
      batch.block_tables + static_cast<int64_t>(seq) * batch.max_blocks_per_seq;
  float acc[kMaxGroupHeads][kMaxHeadDim];
  float running_max[kMaxGroupHeads];
  float running_sum[kMaxGroupHeads];
  float block_max[kMaxGroupHeads];
  float scores[kMaxGroupHeads][kMaxBlockSize];
  for (int g = 0; g < num_heads; ++g) {
    std::fill_n(acc[g], head_dim, 0.0f);
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.0f;
  }
  const int num_keys = position + 1;
  for (int block_start = 0; block_start < num_keys; block_start += block_size) {
    const int block_id = block_table[block_start / block_size];
    const int count = std::min(block_size, num_keys - block_start);
    // Byte offset of key or value j of this block.
    const auto vector_at = [&](int j) {
      return kv_element(layout, layer, kv_slot(layout, block_id, j), kv_head) * element_bytes;
    };
    for (int g = 0; g < num_heads; ++g) block_max[g] = running_max[g];
    for (int j = 0; j < count; ++j) {
      const auto* key = static_cast<const std::byte*>(cache.k) + vector_at(j);
      for (int g = 0; g < num_heads; ++g) {
        const float* q = q_row + static_cast<int64_t>(first_head + g) * head_dim;
        scores[g][j] = dot(q, key, dtype, head_dim) * score_scale;
        block_max[g] = std::max(block_max[g], scores[g][j]);
      }
    }
    for (int g = 0; g < num_heads; ++g) {
      const float correction = std::exp(running_max[g] - block_max[g]);
      running_sum[g] *= correction;
      for (int d = 0; d < head_dim; ++d) acc[g][d] *= correction;
    }
    for (int j = 0; j < count; ++j) {
      const auto* value = static_cast<const std::byte*>(cache.v) + vector_at(j);
      for (int g = 0; g < num_heads; ++g) {
        const float weight = std::exp(scores[g][j] - block_max[g]);
        running_sum[g] += weight;
        axpy(weight, value, dtype, acc[g], head_dim);
      }
    }
    for (int g = 0; g < num_heads; ++g) running_max[g] = block_max[g];
  }
  for (int g = 0; g < num_heads; ++g) {
    const float inv_sum = v_scale / running_sum[g];
    float* out = out_row + static_cast<int64_t>(first_head + g) * head_dim;
    for (int d = 0; d < head_dim; ++d) out[d] = acc[g][d] * inv_sum;
  }
}

Status validate_batch(const AttentionBatch& batch, const KvCacheView& cache) {
  if (cache.layout.head_dim > kMaxHeadDim || cache.layout.block_size > kMaxBlockSize) {
    return unimplemented("paged_attention: head_dim above 512 or block_size above 256");
  }
  if (batch.query_start[0] != 0 || batch.query_start[batch.num_seqs] != batch.num_tokens) {
    return invalid_argument("paged_attention: query_start does not cover the batch");
  }
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int begin = batch.query_start[s];
    const int end = batch.query_start[s + 1];
    const int context = batch.context_lens[s];
    const int blocks_needed = (context + cache.layout.block_size - 1) / cache.layout.block_size;
    if (end < begin || end - begin > context || blocks_needed > batch.max_blocks_per_seq) {
      return invalid_argument("paged_attention: sequence " + std::to_string(s) +
                              " has inconsistent lengths");
    }
    for (int b = 0; b < blocks_needed; ++b) {
      const int block = batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + b];
      if (block < 0 || block >= cache.layout.num_blocks) {
        return invalid_argument("paged_attention: block id " + std::to_string(block) +
                                " outside the pool");
      }
    }
    for (int t = begin; t < end; ++t) {
      if (batch.positions[t] != context - (end - t)) {
        return invalid_argument("paged_attention: token positions of sequence " +
                                std::to_string(s) + " are not the last of its context");
      }
    }
  }
  return {};
}

// The AVX-512 levels: tiles of up to kMaxAttentionTileRows query rows (tokens x heads of one
// KV head), handed out heaviest first (the last tokens of each prompt see the most keys) to
// whichever thread is free.
void vector_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                      int layer, int num_heads, float scale, MatrixView out, CpuThreadPool& pool,
                      CpuIsa isa) {
  const KvLayout& layout = cache.layout;
  const int64_t layer_offset =
      kv_element(layout, layer, 0) * static_cast<int64_t>(layout.element_bytes());
  AttentionProblem problem;
  problem.q = static_cast<const float*>(q.data);
  problem.q_stride = q.row_stride;
  problem.out = static_cast<float*>(out.data);
  problem.out_stride = out.row_stride;
  problem.k = static_cast<const std::byte*>(cache.k) + layer_offset;
  problem.v = static_cast<const std::byte*>(cache.v) + layer_offset;
  problem.layout = layout;
  problem.group = num_heads / layout.num_kv_heads;
  // An FP8 pool's scales, applied to the scores and the output rather than to every element.
  problem.scale = scale * cache.k_scale(layer);
  problem.v_scale = cache.v_scale(layer);
  problem.block_tables = batch.block_tables;
  problem.max_blocks_per_seq = batch.max_blocks_per_seq;
  problem.positions = batch.positions;
  const auto attend = isa == CpuIsa::kAvx512Bf16 && layout.dtype == DType::kBF16
                          ? attend_tile_avx512_bf16
                          : attend_tile_avx512;
  const int heads_per_tile = std::min(problem.group, kMaxAttentionTileRows);
  const int head_chunks = (problem.group + heads_per_tile - 1) / heads_per_tile;
  const int tokens_per_tile = std::max(1, kMaxAttentionTileRows / heads_per_tile);
  const int groups = layout.num_kv_heads * head_chunks;  // tiles side by side per token range
  const auto tiles_of = [&](int seq) {
    return (batch.query_start[seq + 1] - batch.query_start[seq] + tokens_per_tile - 1) /
           tokens_per_tile;
  };
  const auto run_tile = [&](int seq, int tile_index, int group) {
    AttentionTile tile;
    tile.seq = seq;
    tile.kv_head = group / head_chunks;
    tile.first_head = group % head_chunks * heads_per_tile;
    tile.num_heads = std::min(heads_per_tile, problem.group - tile.first_head);
    tile.first_token = batch.query_start[seq] + tile_index * tokens_per_tile;
    tile.num_tokens = std::min(tokens_per_tile, batch.query_start[seq + 1] - tile.first_token);
    attend(problem, tile);
  };
  if (batch.num_seqs > kMaxTiledSeqs) {
    // Beyond the item table below: one item per sequence and group.
    pool.run(static_cast<int64_t>(batch.num_seqs) * groups, [&](int64_t item) {
      const int seq = static_cast<int>(item / groups);
      for (int t = tiles_of(seq) - 1; t >= 0; --t)
        run_tile(seq, t, static_cast<int>(item % groups));
    });
    return;
  }
  // Item i: sequence s with first_item[s] <= i < first_item[s + 1], its tiles last (heaviest)
  // first, the groups of one tile side by side.
  int64_t first_item[kMaxTiledSeqs + 1];
  first_item[0] = 0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    first_item[s + 1] = first_item[s] + static_cast<int64_t>(tiles_of(s)) * groups;
  }
  pool.run(first_item[batch.num_seqs], [&](int64_t item) {
    const int seq = static_cast<int>(
        std::upper_bound(first_item + 1, first_item + batch.num_seqs + 1, item) - (first_item + 1));
    const int64_t local = item - first_item[seq];
    run_tile(seq, tiles_of(seq) - 1 - static_cast<int>(local / groups),
             static_cast<int>(local % groups));
  });
}

}  // namespace

Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                       int layer, int num_heads, float scale, MatrixView out, CpuThreadPool& pool,
                       CpuIsa isa) {
  PDS_RETURN_IF_ERROR(validate_batch(batch, cache));
  const int head_dim = cache.layout.head_dim;
  if ((isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16) && head_dim % 32 == 0 &&
      head_dim <= kMaxVectorHeadDim) {
    vector_attention(q, batch, cache, layer, num_heads, scale, out, pool, isa);
    return {};
  }
  // Other head sizes run the avx2 kernel on AVX-512 CPUs.
  const bool avx2 = isa != CpuIsa::kPortable;
  const int group = num_heads / cache.layout.num_kv_heads;
  const int chunks_per_kv_head = (group + kMaxGroupHeads - 1) / kMaxGroupHeads;
  const int64_t work_items =
      static_cast<int64_t>(batch.num_tokens) * cache.layout.num_kv_heads * chunks_per_kv_head;
  pool.run(work_items, [&](int64_t item) {
    const int per_token = cache.layout.num_kv_heads * chunks_per_kv_head;
    const int token = static_cast<int>(item / per_token);
    const int kv_head = static_cast<int>(item % per_token) / chunks_per_kv_head;
    const int chunk = static_cast<int>(item % per_token) % chunks_per_kv_head;
    const int first_head = kv_head * group + chunk * kMaxGroupHeads;
    const int heads = std::min(kMaxGroupHeads, group - chunk * kMaxGroupHeads);
    const int seq = static_cast<int>(
        std::upper_bound(batch.query_start + 1, batch.query_start + batch.num_seqs + 1, token) -
        (batch.query_start + 1));
    const auto attend = avx2 ? attend_heads<true> : attend_heads<false>;
    attend(q.row<float>(token), first_head, heads, batch, cache, layer, seq, batch.positions[token],
           kv_head, scale, out.row<float>(token));
  });
  return {};
}

}  // namespace pdserve::cpu
