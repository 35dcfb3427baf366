// The CUDA sampler: one thread block per row runs the algorithm of sampling_rows.h on the
// row's logits in place (they become the kept weights). Every reduction is in a fixed order or
// over integers, so a row's token depends on its inputs only, never on scheduling.
#include <climits>

#include "kernels/sampling_cuda.h"

namespace pdserve::cuda {
namespace {

using sampling::RowArgs;
using sampling::RowResult;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

struct Best {
  float value;
  int32_t index;
};

// The larger value, ties to the lower index: an order-independent choice.
__device__ Best better(Best a, Best b) {
  if (a.value != b.value) return a.value > b.value ? a : b;
  return a.index <= b.index ? a : b;
}

struct Shared {
  Best best[kWarps];
  sampling::Mass sums[kWarps];
  double scan[kWarps];
  int int_scan[kWarps];
  uint32_t counts[sampling::kRadixBins];
  sampling::Mass masses[sampling::kRadixBins];
  Best best_all;
  sampling::Mass sum_all;
  uint32_t prefix;
  uint32_t rank;
  sampling::Mass above;
  uint32_t ties;
  int claim;
  int last_kept;
  int cut_token;
};

__device__ Best block_best(Best value, Shared& shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    const Best other{__shfl_down_sync(kFullMask, value.value, offset),
                     __shfl_down_sync(kFullMask, value.index, offset)};
    value = better(value, other);
  }
  if (lane == 0) shared.best[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? shared.best[lane] : Best{sampling::negative_infinity(), INT_MAX};
    for (int offset = 16; offset > 0; offset /= 2) {
      const Best other{__shfl_down_sync(kFullMask, value.value, offset),
                       __shfl_down_sync(kFullMask, value.index, offset)};
      value = better(value, other);
    }
    if (lane == 0) shared.best_all = value;
  }
  __syncthreads();
  return shared.best_all;
}

__device__ sampling::Mass block_sum(sampling::Mass value, Shared& shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(kFullMask, value, offset);
  }
  if (lane == 0) shared.sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? shared.sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_down_sync(kFullMask, value, offset);
    }
    if (lane == 0) shared.sum_all = value;
  }
  __syncthreads();
  return shared.sum_all;
}

// Exclusive prefix sum over the threads in index order, and the total; a fixed tree order.
template <typename T>
__device__ T block_exclusive_sum(T value, T& total, T* warp_totals) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  T inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const T up = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  T within = __shfl_up_sync(kFullMask, inclusive, 1);
  if (lane == 0) within = T(0);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    T running = lane < kWarps ? warp_totals[lane] : T(0);
    for (int offset = 1; offset < 32; offset *= 2) {
      const T up = __shfl_up_sync(kFullMask, running, offset);
      if (lane >= offset) running += up;
    }
    if (lane < kWarps) warp_totals[lane] = running;
  }
  __syncthreads();
  const T before = warp == 0 ? T(0) : warp_totals[warp - 1];
  total = warp_totals[kWarps - 1];
  __syncthreads();  // the totals may be reused at once
  return before + within;
}

__device__ void clear_histogram(Shared& shared) {
  for (int bin = threadIdx.x; bin < sampling::kRadixBins; bin += kThreads) {
    shared.counts[bin] = 0;
    shared.masses[bin] = 0;
  }
  __syncthreads();
}

__device__ void finish(RowResult* result, int32_t token, int32_t status) {
  if (threadIdx.x == 0) *result = RowResult{token, status};
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SampleRowsArgs a) {
  __shared__ Shared shared;
  const int row = blockIdx.x;
  const RowArgs args = a.rows[row];
  RowResult* const result = a.results + row;
  if ((args.flags & sampling::kRowSkip) != 0) return finish(result, 0, sampling::kRowOk);
  float* const logits = a.logits + static_cast<int64_t>(args.logits_row) * a.logits_stride;
  const int vocab = a.vocab;
  const int tid = threadIdx.x;
  const float neg_inf = sampling::negative_infinity();

  // The grammar's mask, then the logits the host sampler would check.
  const int32_t* mask = nullptr;
  if (a.mask_index != nullptr && a.mask_index[row] >= 0) {
    mask = a.masks + static_cast<int64_t>(a.mask_index[row]) * a.mask_words;
  }
  int invalid = 0;
  for (int i = tid; i < vocab; i += kThreads) {
    float x = logits[i];
    if (mask != nullptr && ((static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u) == 0) {
      x = neg_inf;
      logits[i] = x;
    }
    invalid |= !sampling::is_valid_logit(x);
  }
  if (__syncthreads_or(invalid)) return finish(result, 0, sampling::kRowInvalidLogits);

  // logit_bias, banned ids, penalties; each list holds distinct ids.
  const int32_t* const lists = a.lists;
  int bad = 0;
  int overflow = 0;
  for (int e = tid; e < args.bias_count; e += kThreads) {
    const int32_t token = lists[args.bias_offset + 2 * e];
    const float bias =
        sampling::bits_float(static_cast<uint32_t>(lists[args.bias_offset + 2 * e + 1]));
    if (token < 0 || token >= vocab) {
      bad = 1;
    } else {
      logits[token] = sampling::add_rn(logits[token], bias);
    }
  }
  __syncthreads();
  for (int e = tid; e < args.banned_count; e += kThreads) {
    const int32_t token = lists[args.banned_offset + e];
    if (token < 0 || token >= vocab) {
      bad = 1;
    } else {
      logits[token] = neg_inf;
    }
  }
  __syncthreads();
  for (int e = tid; e < args.repetition_count; e += kThreads) {
    const int32_t token = lists[args.repetition_offset + e];
    if (token < 0 || token >= vocab) {
      bad = 1;
      continue;
    }
    const float penalized = sampling::repetition_penalized(logits[token], args.repetition);
    overflow |= penalized == sampling::positive_infinity();
    logits[token] = penalized;
  }
  __syncthreads();
  for (int e = tid; e < args.frequency_count; e += kThreads) {
    const int32_t token = lists[args.frequency_offset + 2 * e];
    const int32_t count = lists[args.frequency_offset + 2 * e + 1];
    if (token < 0 || token >= vocab) {
      bad = 1;
      continue;
    }
    const float penalized =
        sampling::frequency_penalized(logits[token], args.frequency, count, args.presence);
    overflow |= penalized == sampling::positive_infinity();
    logits[token] = penalized;
  }
  if (__syncthreads_or(bad)) return finish(result, 0, sampling::kRowBadList);
  if (__syncthreads_or(overflow)) return finish(result, 0, sampling::kRowPenaltyOverflow);

  // The argmax, ties to the lowest id (each thread sees its ids in increasing order).
  Best local{neg_inf, INT_MAX};
  for (int i = tid; i < vocab; i += kThreads) {
    const float x = logits[i];
    if (x > local.value) local = Best{x, i};
  }
  const Best best = block_best(local, shared);
  if (best.value == neg_inf) return finish(result, 0, sampling::kRowAllMasked);
  if ((args.flags & sampling::kRowForced) != 0) {
    return finish(result, args.forced_token, sampling::kRowOk);
  }
  if ((args.flags & sampling::kRowGreedy) != 0) return finish(result, best.index, sampling::kRowOk);

  // top_k: the k-th largest logit, counting repeats.
  float threshold = neg_inf;
  if (args.top_k > 0) {
    if (tid == 0) {
      shared.prefix = 0;
      shared.rank = static_cast<uint32_t>(args.top_k);
    }
    for (int pass = 0; pass < sampling::kRadixPasses; ++pass) {
      clear_histogram(shared);
      const uint32_t prefix = shared.prefix;
      const uint32_t prefix_mask = sampling::radix_prefix_mask(pass);
      for (int i = tid; i < vocab; i += kThreads) {
        const uint32_t key = sampling::order_key(logits[i]);
        if ((key & prefix_mask) == prefix) {
          atomicAdd(&shared.counts[sampling::radix_digit(key, pass)], 1u);
        }
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t rank = shared.rank;
        const int bin = sampling::choose_rank_bin(shared.counts, rank);
        shared.rank = rank;
        shared.prefix = sampling::with_digit(prefix, pass, bin);
      }
      __syncthreads();
    }
    threshold = sampling::key_float(shared.prefix);
  }

  // The kept tokens' weights replace their logits (0: dropped).
  sampling::Mass mass = 0;
  for (int i = tid; i < vocab; i += kThreads) {
    const float weight =
        sampling::kept_weight(logits[i], best.value, args.temperature, threshold, args.min_p);
    logits[i] = weight;
    if (weight > 0.0f) mass += sampling::fixed_mass(weight);
  }
  __syncthreads();

  // top_p: the cut weight W* and how many tokens tied at it stay.
  if (args.top_p < 1.0f) {
    const sampling::Mass total = block_sum(mass, shared);
    const sampling::Mass target = sampling::top_p_target(args.top_p, total);
    if (tid == 0) {
      shared.prefix = 0;
      shared.above = 0;
    }
    for (int pass = 0; pass < sampling::kRadixPasses; ++pass) {
      clear_histogram(shared);
      const uint32_t prefix = shared.prefix;
      const uint32_t prefix_mask = sampling::radix_prefix_mask(pass);
      for (int i = tid; i < vocab; i += kThreads) {
        const float weight = logits[i];
        if (weight <= 0.0f) continue;
        const uint32_t key = sampling::order_key(weight);
        if ((key & prefix_mask) != prefix) continue;
        const int digit = sampling::radix_digit(key, pass);
        atomicAdd(&shared.counts[digit], 1u);
        atomicAdd(&shared.masses[digit], sampling::fixed_mass(weight));
      }
      __syncthreads();
      if (tid == 0) {
        sampling::Mass above = shared.above;
        const int bin = sampling::choose_mass_bin(shared.counts, shared.masses, target, above);
        shared.above = above;
        shared.prefix = sampling::with_digit(prefix, pass, bin);
        shared.ties = shared.counts[bin];
      }
      __syncthreads();
    }
    const float cut_weight = sampling::key_float(shared.prefix);
    const uint32_t needed =
        sampling::ties_needed(shared.above, sampling::fixed_mass(cut_weight), shared.ties, target);
    // The needed-th token of weight W* in id order closes the prefix.
    int first = 0;
    int end = 0;
    sampling::draw_chunk(vocab, tid, kThreads, first, end);
    int tied = 0;
    for (int i = first; i < end; ++i) tied += logits[i] == cut_weight;
    int tied_total = 0;
    const int tied_before = block_exclusive_sum(tied, tied_total, shared.int_scan);
    if (tid == 0) shared.cut_token = INT_MAX;
    __syncthreads();
    if (static_cast<uint32_t>(tied_before) < needed &&
        static_cast<uint32_t>(tied_before + tied) >= needed) {
      int seen = tied_before;
      for (int i = first; i < end; ++i) {
        if (logits[i] == cut_weight && static_cast<uint32_t>(++seen) == needed) {
          shared.cut_token = i;
          break;
        }
      }
    }
    __syncthreads();
    const int cut_token = shared.cut_token;
    for (int i = tid; i < vocab; i += kThreads) {
      const float weight = logits[i];
      if (weight > 0.0f && !sampling::survives_top_p(weight, i, cut_weight, cut_token)) {
        logits[i] = 0.0f;
      }
    }
    __syncthreads();
  }

  // The draw: the first kept token, in id order, whose running weight exceeds u * total.
  int first = 0;
  int end = 0;
  sampling::draw_chunk(vocab, tid, kThreads, first, end);
  double chunk = 0.0;
  int last_kept = -1;
  for (int i = first; i < end; ++i) {
    const float weight = logits[i];
    if (weight > 0.0f) {
      chunk += static_cast<double>(weight);
      last_kept = i;
    }
  }
  double total = 0.0;
  const double before = block_exclusive_sum(chunk, total, shared.scan);
  const double target = args.unit * total;
  if (tid == 0) {
    shared.claim = INT_MAX;
    shared.last_kept = -1;
  }
  __syncthreads();
  atomicMax(&shared.last_kept, last_kept);
  if (before + chunk > target) {
    double running = before;
    for (int i = first; i < end; ++i) {
      const float weight = logits[i];
      if (weight <= 0.0f) continue;
      running += static_cast<double>(weight);
      if (running > target) {
        atomicMin(&shared.claim, i);
        break;
      }
    }
  }
  __syncthreads();
  // No claim only when rounding made u * total reach the total: the last kept token.
  const int token = shared.claim != INT_MAX ? shared.claim : shared.last_kept;
  finish(result, token, token >= 0 ? sampling::kRowOk : sampling::kRowAllMasked);
}

}  // namespace

cudaError_t sample_rows(const SampleRowsArgs& args, cudaStream_t stream) {
  if (args.num_rows <= 0) return cudaSuccess;
  sample_rows_kernel<<<args.num_rows, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace pdserve::cuda
