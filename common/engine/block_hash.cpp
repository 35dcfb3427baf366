#include "common/engine/block_hash.h"

namespace pdserve {
namespace {

uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  uint64_t state = fmix64(parent_hash + kGolden);
  for (int32_t token : tokens) {
    state = fmix64((state + kGolden) ^ static_cast<uint32_t>(token));
  }
  return fmix64(state ^ (static_cast<uint64_t>(tokens.size()) * kGolden));
}

}  // namespace pdserve
