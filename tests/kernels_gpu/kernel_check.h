// The host side of the kernel checks (tests/kernels_gpu): an error measure per row, a
// double-precision reference of paged attention, and inputs that make a wrong kernel visible
// (peaked scores on keys planted at block and split-K boundaries, random row scales). No CUDA
// here: kernel_check_test proves every piece on the CPU, against the CPU backend, so a GPU
// session only has to trust the device half.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/kv_layout.h"

namespace pdserve::kernel_check {

// Errors of `actual` against `expected`, row by row: ||a_r - e_r||_2 / ||e_r||_2 (the absolute
// error where the expected row is all zero). A row scaled 1000 times smaller than its
// neighbours is held to the same relative precision, which one absolute bound against the
// largest value of the whole output does not do. Elements that are NaN (outputs are poisoned
// with NaN first) count as never written and make their row's error infinite.
struct RowErrors {
  std::vector<double> relative;
  double worst = 0.0;
  int64_t worst_row = -1;
  int64_t unwritten = 0;

  bool within(double tolerance) const { return unwritten == 0 && worst <= tolerance; }
  std::string describe() const;  // "worst row 3: 1.2e-06 over 17 rows" (+ unwritten count)
};
RowErrors row_errors(std::span<const float> actual, std::span<const double> expected, int64_t rows,
                     int64_t cols);
RowErrors row_errors(std::span<const float> actual, std::span<const float> expected, int64_t rows,
                     int64_t cols);

// Deterministic pseudo-random floats in [-1, 1) (SplitMix64): fast enough for the 300M-element
// GEMM operands, and the same on every machine.
std::vector<float> uniform_floats(size_t count, uint64_t seed, float scale = 1.0f);
// Each element as stored in `dtype` and read back (bf16 rounding; float32 unchanged).
std::vector<float> rounded_to(std::vector<float> values, DType dtype);

// out[r] = in[r] @ weight^T in double, for the listed rows of in [*, k]; weight [n, k].
std::vector<double> reference_linear(std::span<const float> in, std::span<const float> weight,
                                     int64_t n, int64_t k, std::span<const int64_t> rows);

// A paged-attention problem held in host memory: float copies of one layer's K and V
// ([num_blocks][block_size][kv_heads][head_dim], values as the pool stores them) and the
// batch arrays of AttentionBatch.
struct PagedProblem {
  KvLayout layout;  // num_layers 1
  DType q_dtype = DType::kF32;
  int num_heads = 0;
  float scale = 1.0f;
  std::vector<float> q;  // [tokens][num_heads * head_dim]
  std::vector<float> k_pool, v_pool;
  std::vector<int32_t> query_start, context_lens, block_tables, positions, slot_mapping;
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  int max_context_len = 0;

  int num_seqs() const { return static_cast<int>(context_lens.size()); }
  int num_tokens() const { return static_cast<int>(positions.size()); }
  int64_t q_width() const { return int64_t{num_heads} * layout.head_dim; }
  // Where key `position` of sequence `seq` lives in the pools (element offset of kv head 0).
  int64_t key_offset(int seq, int position) const;
};

// Sequences with `query_lens[i]` new tokens ending at `context_lens[i]` keys, their blocks
// shuffled through a pool with a few spare blocks; random q, K and V of unit scale, with each
// sequence's values multiplied by its own scale, log-uniform in [0.001, 1000], when
// `scatter_row_scales` (so output rows differ by orders of magnitude). `kv_dtype` and
// `q_dtype` round the values as the device will hold them.
PagedProblem make_paged_problem(int num_heads, int num_kv_heads, int head_dim, int block_size,
                                const std::vector<int>& query_lens,
                                const std::vector<int>& context_lens, DType q_dtype, DType kv_dtype,
                                uint64_t seed, bool scatter_row_scales = false);

// Key positions where a kernel that tiles or splits the keys can slip: the first and last
// key, both sides of the split boundaries (multiples of keys_per_split, 0 = none; an even
// spread of them when they do not all fit), then both sides of a few block boundaries and
// 32-key tile boundaries spread over the context; sorted, unique, below context_len, at most
// `max_count` (taken in that order).
std::vector<int> boundary_positions(int context_len, int block_size, int keys_per_split,
                                    int max_count);

// Makes the scores peaked: each KV head gets a random unit direction u; every query of its
// group gets (score / scale) * u added, the planted keys of each sequence become u and every
// other key loses its component along u. A planted key visible to a query then scores about
// `score` and a random key about 0 +- 0.3, so with score 20 the planted keys hold all but
// ~1e-4 of the weight even over 32k keys, shared equally between them: a kernel that drops or
// repeats one of them is off by about 1 / (planted keys visible) of the output. The planted
// values get distinct patterns 4x larger than the rest. With `single` the last planted key of
// each sequence scores `score` and the others score / 2 (one key dominates where visible).
void plant_peaked_keys(PagedProblem& problem, const std::vector<std::vector<int>>& positions,
                       float score, bool single, uint64_t seed);

// Causal attention of every query row over its sequence's keys 0..position, in double, from
// the float values held in the problem. Output [tokens][num_heads * head_dim]. `skip_key`,
// when >= 0, leaves that key position of every sequence out (a model of a kernel that drops
// a key at a boundary, for proving that the checks catch it).
std::vector<double> reference_attention(const PagedProblem& problem, int skip_key = -1);

}  // namespace pdserve::kernel_check
