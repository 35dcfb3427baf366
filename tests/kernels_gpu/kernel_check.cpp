#include "tests/kernels_gpu/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>

namespace pdserve::kernel_check {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) from the top 24 bits.
float next_uniform(uint64_t& state) {
  return static_cast<float>(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename Expected>
RowErrors row_errors_of(std::span<const float> actual, std::span<const Expected> expected,
                        int64_t rows, int64_t cols) {
  RowErrors errors;
  errors.relative.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double difference = 0.0;
    double norm = 0.0;
    bool unwritten = false;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      if (std::isnan(actual[i])) {
        ++errors.unwritten;
        unwritten = true;
        continue;
      }
      const double d = static_cast<double>(actual[i]) - static_cast<double>(expected[i]);
      difference += d * d;
      norm += static_cast<double>(expected[i]) * static_cast<double>(expected[i]);
    }
    double relative = norm > 0.0 ? std::sqrt(difference / norm) : std::sqrt(difference);
    if (unwritten || !std::isfinite(relative)) relative = std::numeric_limits<double>::infinity();
    errors.relative[static_cast<size_t>(r)] = relative;
    if (errors.worst_row < 0 || relative > errors.worst) {
      errors.worst = relative;
      errors.worst_row = r;
    }
  }
  return errors;
}

}  // namespace

std::string RowErrors::describe() const {
  char text[160];
  std::snprintf(text, sizeof(text), "worst row %lld: relative error %.3g over %zu rows",
                static_cast<long long>(worst_row), worst, relative.size());
  std::string out = text;
  if (unwritten > 0) out += " (" + std::to_string(unwritten) + " elements never written)";
  return out;
}

RowErrors row_errors(std::span<const float> actual, std::span<const double> expected, int64_t rows,
                     int64_t cols) {
  return row_errors_of(actual, expected, rows, cols);
}

RowErrors row_errors(std::span<const float> actual, std::span<const float> expected, int64_t rows,
                     int64_t cols) {
  return row_errors_of(actual, expected, rows, cols);
}

std::vector<float> uniform_floats(size_t count, uint64_t seed, float scale) {
  std::vector<float> values(count);
  // SplitMix64's state after i steps is seed + i * gamma, so element i needs no predecessor:
  // the same sequence as one thread stepping through it, filled on every core (the real-size
  // GEMM operands reach 622M floats).
  const auto total = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total; ++i) {
    uint64_t state = seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    values[static_cast<size_t>(i)] = next_uniform(state) * scale;
  }
  return values;
}

std::vector<float> rounded_to(std::vector<float> values, DType dtype) {
  if (dtype == DType::kBF16) {
    const auto total = static_cast<int64_t>(values.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; ++i) {
      values[static_cast<size_t>(i)] = bf16_to_float(float_to_bf16(values[static_cast<size_t>(i)]));
    }
  }
  return values;
}

std::vector<double> reference_linear(std::span<const float> in, std::span<const float> weight,
                                     int64_t n, int64_t k, std::span<const int64_t> rows) {
  std::vector<double> out(rows.size() * static_cast<size_t>(n));
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* x = in.data() + rows[i] * k;
#pragma omp parallel for schedule(static)
    for (int64_t col = 0; col < n; ++col) {
      const float* w = weight.data() + col * k;
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(x[j]) * static_cast<double>(w[j]);
      out[i * static_cast<size_t>(n) + static_cast<size_t>(col)] = sum;
    }
  }
  return out;
}

int64_t PagedProblem::key_offset(int seq, int position) const {
  const int32_t block =
      block_tables[static_cast<size_t>(seq) * max_blocks_per_seq + position / layout.block_size];
  return kv_element(layout, 0, kv_slot(layout, block, position % layout.block_size));
}

PagedProblem make_paged_problem(int num_heads, int num_kv_heads, int head_dim, int block_size,
                                const std::vector<int>& query_lens,
                                const std::vector<int>& context_lens, DType q_dtype, DType kv_dtype,
                                uint64_t seed, bool scatter_row_scales) {
  PagedProblem p;
  p.q_dtype = q_dtype;
  p.num_heads = num_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  int total_blocks = 0;
  for (size_t i = 0; i < context_lens.size(); ++i) {
    const int blocks = (context_lens[i] + block_size - 1) / block_size;
    p.max_blocks_per_seq = std::max(p.max_blocks_per_seq, blocks);
    p.max_query_len = std::max(p.max_query_len, query_lens[i]);
    p.max_context_len = std::max(p.max_context_len, context_lens[i]);
    total_blocks += blocks;
  }
  p.layout = KvLayout{1, total_blocks + 3, block_size, num_kv_heads, head_dim, kv_dtype};
  std::vector<int32_t> free_blocks(static_cast<size_t>(p.layout.num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937_64(seed));
  const size_t pool = static_cast<size_t>(p.layout.layer_elements());
  p.k_pool = uniform_floats(pool, seed + 1);
  p.v_pool = uniform_floats(pool, seed + 2);
  uint64_t scale_state = seed + 3;
  size_t next = 0;
  p.query_start.push_back(0);
  for (size_t i = 0; i < context_lens.size(); ++i) {
    std::vector<int32_t> table(static_cast<size_t>(p.max_blocks_per_seq), 0);
    const int blocks = (context_lens[i] + block_size - 1) / block_size;
    const float value_scale =
        scatter_row_scales ? std::pow(10.0f, 3.0f * next_uniform(scale_state)) : 1.0f;
    for (int b = 0; b < blocks; ++b) {
      const int32_t block = free_blocks[next++];
      table[static_cast<size_t>(b)] = block;
      const size_t first =
          static_cast<size_t>(block) * block_size * static_cast<size_t>(p.layout.token_elements());
      const size_t count = static_cast<size_t>(block_size) * p.layout.token_elements();
      for (size_t e = first; e < first + count; ++e) p.v_pool[e] *= value_scale;
    }
    p.block_tables.insert(p.block_tables.end(), table.begin(), table.end());
    for (int t = 0; t < query_lens[i]; ++t) {
      const int position = context_lens[i] - query_lens[i] + t;
      p.positions.push_back(position);
      p.slot_mapping.push_back(table[static_cast<size_t>(position / block_size)] * block_size +
                               position % block_size);
    }
    p.query_start.push_back(p.query_start.back() + query_lens[i]);
    p.context_lens.push_back(context_lens[i]);
  }
  p.q = rounded_to(uniform_floats(static_cast<size_t>(p.num_tokens() * p.q_width()), seed + 4),
                   q_dtype);
  p.k_pool = rounded_to(std::move(p.k_pool), kv_dtype);
  p.v_pool = rounded_to(std::move(p.v_pool), kv_dtype);
  return p;
}

std::vector<int> boundary_positions(int context_len, int block_size, int keys_per_split,
                                    int max_count) {
  std::vector<int> wanted = {context_len - 1, 0};
  if (keys_per_split > 0) {
    // Every split boundary, or an even spread of them when they are more than about two
    // thirds of the budget holds.
    const int boundaries = (context_len - 1) / keys_per_split;
    const int room = std::max(1, (max_count - 2) * 2 / 3 / 2);
    const int stride = std::max(1, (boundaries + room - 1) / room);
    for (int i = 1; i <= boundaries; i += stride) {
      wanted.push_back(i * keys_per_split - 1);
      wanted.push_back(i * keys_per_split);
    }
  }
  // A few block boundaries (and the 32-key tiles of the CUDA kernel) spread over the context.
  const int num_blocks = (context_len + block_size - 1) / block_size;
  for (int i = 1; i <= 6 && i < num_blocks; ++i) {
    const int boundary = static_cast<int>(int64_t{num_blocks} * i / 7) * block_size;
    wanted.push_back(boundary - 1);
    wanted.push_back(boundary);
    const int tile = boundary / 32 * 32 + 32;
    wanted.push_back(tile - 1);
    wanted.push_back(tile);
  }
  std::vector<int> positions;
  std::set<int> seen;
  for (int position : wanted) {
    if (position < 0 || position >= context_len || !seen.insert(position).second) continue;
    if (static_cast<int>(positions.size()) == max_count) break;
    positions.push_back(position);
  }
  std::sort(positions.begin(), positions.end());
  return positions;
}

void plant_peaked_keys(PagedProblem& p, const std::vector<std::vector<int>>& positions, float score,
                       bool single, uint64_t seed) {
  const int head_dim = p.layout.head_dim;
  const int group = p.num_heads / p.layout.num_kv_heads;
  std::vector<std::vector<float>> directions;
  for (int h = 0; h < p.layout.num_kv_heads; ++h) {
    std::vector<float> u = uniform_floats(static_cast<size_t>(head_dim), seed + 17 * h);
    double norm = 0.0;
    for (float x : u) norm += double{x} * x;
    for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
    directions.push_back(std::move(u));
  }
  // Queries: + (score / scale) u of their KV head.
  for (int t = 0; t < p.num_tokens(); ++t) {
    for (int head = 0; head < p.num_heads; ++head) {
      float* q = p.q.data() + t * p.q_width() + int64_t{head} * head_dim;
      const std::vector<float>& u = directions[static_cast<size_t>(head / group)];
      for (int d = 0; d < head_dim; ++d) q[d] += score / p.scale * u[static_cast<size_t>(d)];
    }
  }
  p.q = rounded_to(std::move(p.q), p.q_dtype);
  uint64_t value_state = seed + 5;
  for (int s = 0; s < p.num_seqs(); ++s) {
    const std::vector<int>& planted = positions[static_cast<size_t>(s)];
    const std::set<int> planted_set(planted.begin(), planted.end());
    // This sequence's value scale, read off its first value (make_paged_problem's scatter).
    double value_scale = 0.0;
    for (int d = 0; d < head_dim; ++d) {
      value_scale = std::max(value_scale, std::fabs(double{p.v_pool[p.key_offset(s, 0) + d]}));
    }
    for (int position = 0; position < p.context_lens[static_cast<size_t>(s)]; ++position) {
      const int64_t base = p.key_offset(s, position);
      const bool is_planted = planted_set.count(position) > 0;
      const float emphasis = !single || position == planted.back() ? 1.0f : 0.5f;
      for (int h = 0; h < p.layout.num_kv_heads; ++h) {
        float* k = p.k_pool.data() + base + int64_t{h} * head_dim;
        float* v = p.v_pool.data() + base + int64_t{h} * head_dim;
        const std::vector<float>& u = directions[static_cast<size_t>(h)];
        if (is_planted) {
          for (int d = 0; d < head_dim; ++d) {
            k[d] = emphasis * u[static_cast<size_t>(d)];
            v[d] = static_cast<float>(4.0 * value_scale * next_uniform(value_state));
          }
        } else {
          double along = 0.0;
          for (int d = 0; d < head_dim; ++d) along += double{k[d]} * u[static_cast<size_t>(d)];
          for (int d = 0; d < head_dim; ++d) {
            k[d] -= static_cast<float>(along * u[static_cast<size_t>(d)]);
          }
        }
      }
    }
  }
  p.k_pool = rounded_to(std::move(p.k_pool), p.layout.dtype);
  p.v_pool = rounded_to(std::move(p.v_pool), p.layout.dtype);
}

std::vector<double> reference_attention(const PagedProblem& p, int skip_key) {
  const int head_dim = p.layout.head_dim;
  const int group = p.num_heads / p.layout.num_kv_heads;
  std::vector<int> seq_of_token(static_cast<size_t>(p.num_tokens()));
  for (int s = 0; s < p.num_seqs(); ++s) {
    for (int t = p.query_start[static_cast<size_t>(s)];
         t < p.query_start[static_cast<size_t>(s) + 1]; ++t) {
      seq_of_token[static_cast<size_t>(t)] = s;
    }
  }
  std::vector<double> out(static_cast<size_t>(p.num_tokens() * p.q_width()), 0.0);
  // Rows are independent: spread them over the cores (32k contexts in double add up).
#pragma omp parallel for schedule(dynamic)
  for (int64_t row = 0; row < int64_t{p.num_tokens()} * p.num_heads; ++row) {
    const int t = static_cast<int>(row / p.num_heads);
    const int head = static_cast<int>(row % p.num_heads);
    const int s = seq_of_token[static_cast<size_t>(t)];
    const int visible =
        std::min(p.positions[static_cast<size_t>(t)] + 1, p.context_lens[static_cast<size_t>(s)]);
    const float* q = p.q.data() + t * p.q_width() + int64_t{head} * head_dim;
    const int64_t kv_offset = int64_t{head / group} * head_dim;
    std::vector<double> scores(static_cast<size_t>(std::max(visible, 0)),
                               -std::numeric_limits<double>::infinity());
    double max_score = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < visible; ++j) {
      if (j == skip_key) continue;
      const float* k = p.k_pool.data() + p.key_offset(s, j) + kv_offset;
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d) dot += double{q[d]} * double{k[d]};
      scores[static_cast<size_t>(j)] = dot * p.scale;
      max_score = std::max(max_score, scores[static_cast<size_t>(j)]);
    }
    double* o = out.data() + t * p.q_width() + int64_t{head} * head_dim;
    double total = 0.0;
    for (int j = 0; j < visible; ++j) {
      if (j == skip_key) continue;
      const double weight = std::exp(scores[static_cast<size_t>(j)] - max_score);
      total += weight;
      const float* v = p.v_pool.data() + p.key_offset(s, j) + kv_offset;
      for (int d = 0; d < head_dim; ++d) o[d] += weight * v[d];
    }
    if (total > 0.0) {
      for (int d = 0; d < head_dim; ++d) o[d] /= total;
    }
  }
  return out;
}

}  // namespace pdserve::kernel_check
