// The disk tier's index and file format. One file per block, named by its key, under
// <dir>/blocks/: a header (magic, format, key, parent key, checksum, token count, payload
// size), the block's tokens, then its KV bytes as the host tier holds them. <dir>/manifest.json
// names what the files were written for (the model and the KV layout, a fingerprint): at open,
// files of the same fingerprint are indexed again (least recently written evicted first), and
// any other directory content is cleared, with a warning. LRU within a byte capacity; an entry
// being read by a reload (pinned) is never evicted. Not thread-safe: the store serializes the
// index; the file I/O (TierFiles) runs outside its lock, on its worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/core/status.h"
#include "common/engine/kv_tier.h"
#include "kv_tiers/tier_files.h"

namespace pdserve::kv_tiers {

struct DiskTierOptions {
  std::filesystem::path dir;
  uint64_t capacity_bytes = 0;
  std::string fingerprint;  // model + KV layout (kv_tier_fingerprint)
  uint64_t block_bytes = 0;
  int block_size = 0;
};

// The bytes of a block file before its payload (header and tokens).
std::vector<std::byte> encode_block_file_head(const TieredBlockId& id, uint64_t checksum,
                                              uint64_t payload_bytes);
struct BlockFileHead {
  TieredBlockId id;
  uint64_t checksum = 0;
  uint64_t payload_bytes = 0;
  uint64_t head_bytes = 0;  // where the payload starts
};
// DataLoss for bytes that are not a block file head of `block_size` tokens whose key is the
// chained hash of its parent key and tokens.
Result<BlockFileHead> decode_block_file_head(std::span<const std::byte> bytes, int block_size);
// The head's size for blocks of `block_size` tokens.
uint64_t block_file_head_bytes(int block_size);

class DiskTier {
 public:
  struct Entry {
    TieredBlockId id;
    uint64_t checksum = 0;
    int readers = 0;
    std::list<uint64_t>::iterator lru_position;
  };
  struct OpenReport {
    int reindexed = 0;
    int dropped = 0;       // unreadable or bad files removed
    bool cleared = false;  // written for another model or layout
  };

  // Creates <dir>/blocks when missing. InvalidArgument (a bad flag) when `dir` is not a writable
  // folder.
  static Result<std::unique_ptr<DiskTier>> open(DiskTierOptions options, TierFiles& files,
                                                OpenReport* report = nullptr);

  const DiskTierOptions& options() const { return options_; }
  std::filesystem::path path_of(uint64_t key) const;
  uint64_t file_bytes() const { return file_bytes_; }

  Entry* find(uint64_t key);
  const Entry* find(uint64_t key) const;
  // Most recently used.
  void touch(uint64_t key);
  // Adds a written block (replacing an entry of the same key); returns the entries evicted to
  // stay within the capacity (their files are the caller's to remove).
  std::vector<uint64_t> insert(TieredBlockId id, uint64_t checksum);
  void erase(uint64_t key);
  // Whether a block of file_bytes() could be stored now without evicting a pinned entry.
  bool can_take_one() const;

  int num_blocks() const { return static_cast<int>(entries_.size()); }
  uint64_t used_bytes() const { return entries_.size() * file_bytes_; }
  // Keys, most recently used first.
  std::vector<uint64_t> keys() const;

 private:
  DiskTier(DiskTierOptions options, TierFiles& files);
  Status reindex(OpenReport& report);

  DiskTierOptions options_;
  TierFiles& files_;
  uint64_t file_bytes_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front: evicted first
};

}  // namespace pdserve::kv_tiers
