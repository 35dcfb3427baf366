#include "kv_tiers/disk_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/core/files.h"
#include "common/core/log.h"
#include "common/engine/block_hash.h"

namespace pdserve::kv_tiers {
namespace {

constexpr uint32_t kMagic = 0x564b4450;  // "PDKV"
constexpr uint32_t kFormat = 1;
constexpr int kManifestFormat = 1;
// magic, format, key, parent key, checksum, token count, padding, payload bytes.
constexpr uint64_t kFixedHeadBytes = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8;

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  const auto* bytes = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

template <typename T>
T get(std::span<const std::byte> bytes, size_t& at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

std::string key_name(uint64_t key) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string name(16, '0');
  for (int i = 15; i >= 0; --i, key >>= 4) name[static_cast<size_t>(i)] = kDigits[key & 0xf];
  return name;
}

}  // namespace

uint64_t block_file_head_bytes(int block_size) {
  return kFixedHeadBytes + 4 * static_cast<uint64_t>(block_size);
}

std::vector<std::byte> encode_block_file_head(const TieredBlockId& id, uint64_t checksum,
                                              uint64_t payload_bytes) {
  std::vector<std::byte> out;
  out.reserve(block_file_head_bytes(static_cast<int>(id.tokens.size())));
  put(out, kMagic);
  put(out, kFormat);
  put(out, id.key);
  put(out, id.parent_key);
  put(out, checksum);
  put(out, static_cast<uint32_t>(id.tokens.size()));
  put(out, uint32_t{0});
  put(out, payload_bytes);
  for (int32_t token : id.tokens) put(out, token);
  return out;
}

Result<BlockFileHead> decode_block_file_head(std::span<const std::byte> bytes, int block_size) {
  const uint64_t expected = block_file_head_bytes(block_size);
  if (bytes.size() < expected) return data_loss("block file head is truncated");
  size_t at = 0;
  if (get<uint32_t>(bytes, at) != kMagic) return data_loss("not a block file (bad magic)");
  if (get<uint32_t>(bytes, at) != kFormat) return data_loss("block file of another format");
  BlockFileHead head;
  head.id.key = get<uint64_t>(bytes, at);
  head.id.parent_key = get<uint64_t>(bytes, at);
  head.checksum = get<uint64_t>(bytes, at);
  const uint32_t num_tokens = get<uint32_t>(bytes, at);
  at += 4;
  head.payload_bytes = get<uint64_t>(bytes, at);
  if (num_tokens != static_cast<uint32_t>(block_size)) {
    return data_loss("block file holds " + std::to_string(num_tokens) + " tokens, not " +
                     std::to_string(block_size));
  }
  head.id.tokens.resize(num_tokens);
  for (int32_t& token : head.id.tokens) token = get<int32_t>(bytes, at);
  if (hash_block_tokens(head.id.parent_key, head.id.tokens) != head.id.key) {
    return data_loss("block file key does not match its parent key and tokens");
  }
  head.head_bytes = expected;
  return head;
}

DiskTier::DiskTier(DiskTierOptions options, TierFiles& files)
    : options_(std::move(options)),
      files_(files),
      file_bytes_(block_file_head_bytes(options_.block_size) + options_.block_bytes) {}

Result<std::unique_ptr<DiskTier>> DiskTier::open(DiskTierOptions options, TierFiles& files,
                                                 OpenReport* report) {
  std::error_code error;
  if (!std::filesystem::is_directory(options.dir, error)) {
    return invalid_argument("--kv-offload-disk-dir " + options.dir.string() +
                            " is not an existing folder");
  }
  std::filesystem::create_directories(options.dir / "blocks", error);
  if (error) {
    return invalid_argument("--kv-offload-disk-dir " + options.dir.string() +
                            " is not writable: " + error.message());
  }
  auto tier = std::unique_ptr<DiskTier>(new DiskTier(std::move(options), files));
  OpenReport local;
  PDS_RETURN_IF_ERROR(tier->reindex(report != nullptr ? *report : local));
  return tier;
}

Status DiskTier::reindex(OpenReport& report) {
  const std::filesystem::path manifest = options_.dir / "manifest.json";
  bool same = false;
  if (Result<nlohmann::json> json = read_json_file(manifest); json.ok()) {
    same = json->value("format", 0) == kManifestFormat &&
           json->value("fingerprint", std::string()) == options_.fingerprint;
  }
  PDS_ASSIGN_OR_RETURN(std::vector<std::filesystem::path> paths,
                       files_.list(options_.dir / "blocks"));
  if (!same) {
    report.cleared = !paths.empty() || std::filesystem::exists(manifest);
    for (const auto& path : paths) PDS_RETURN_IF_ERROR(files_.remove(path));
    const nlohmann::json written = {{"format", kManifestFormat},
                                    {"fingerprint", options_.fingerprint}};
    const Status status = write_file(manifest, written.dump(2) + "\n");
    if (!status.ok()) {
      return invalid_argument("--kv-offload-disk-dir " + options_.dir.string() +
                              " is not writable: " + status.message());
    }
    return Status::ok_status();
  }
  struct Found {
    std::filesystem::file_time_type written;
    BlockFileHead head;
  };
  std::vector<Found> found;
  std::vector<std::byte> head_bytes(block_file_head_bytes(options_.block_size));
  for (const auto& path : paths) {
    Result<BlockFileHead> head = data_loss("unreadable");
    Result<uint64_t> size = files_.size(path);
    Result<size_t> read = files_.read(path, 0, head_bytes);
    if (size.ok() && *size == file_bytes_ && read.ok() && *read == head_bytes.size()) {
      head = decode_block_file_head(head_bytes, options_.block_size);
    }
    std::error_code error;
    const auto written = std::filesystem::last_write_time(path, error);
    if (!head.ok() || error || head->payload_bytes != options_.block_bytes ||
        path.filename() != key_name(head->id.key)) {
      ++report.dropped;
      (void)files_.remove(path);  // a leftover temporary or a damaged file
      continue;
    }
    found.push_back({written, std::move(*head)});
  }
  std::ranges::sort(found, {}, &Found::written);
  for (Found& block : found) {
    for (uint64_t evicted : insert(std::move(block.head.id), block.head.checksum)) {
      (void)files_.remove(path_of(evicted));
    }
  }
  report.reindexed = num_blocks();
  return Status::ok_status();
}

std::filesystem::path DiskTier::path_of(uint64_t key) const {
  return options_.dir / "blocks" / key_name(key);
}

DiskTier::Entry* DiskTier::find(uint64_t key) {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

const DiskTier::Entry* DiskTier::find(uint64_t key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void DiskTier::touch(uint64_t key) {
  Entry* entry = find(key);
  if (entry == nullptr) return;
  lru_.splice(lru_.end(), lru_, entry->lru_position);
}

std::vector<uint64_t> DiskTier::insert(TieredBlockId id, uint64_t checksum) {
  const uint64_t key = id.key;
  erase(key);
  std::vector<uint64_t> evicted;
  auto victim = lru_.begin();
  while ((entries_.size() + 1) * file_bytes_ > options_.capacity_bytes && victim != lru_.end()) {
    Entry& entry = entries_.at(*victim);
    if (entry.readers > 0) {
      ++victim;
      continue;
    }
    evicted.push_back(*victim);
    entries_.erase(*victim);
    victim = lru_.erase(victim);
  }
  if ((entries_.size() + 1) * file_bytes_ > options_.capacity_bytes) {
    evicted.push_back(key);  // no room: the new file goes too
    return evicted;
  }
  Entry entry;
  entry.id = std::move(id);
  entry.checksum = checksum;
  entry.lru_position = lru_.insert(lru_.end(), key);
  entries_.emplace(key, std::move(entry));
  return evicted;
}

void DiskTier::erase(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  lru_.erase(it->second.lru_position);
  entries_.erase(it);
}

bool DiskTier::can_take_one() const {
  if ((entries_.size() + 1) * file_bytes_ <= options_.capacity_bytes) return true;
  return std::ranges::any_of(entries_, [](const auto& item) { return item.second.readers == 0; });
}

std::vector<uint64_t> DiskTier::keys() const {
  return {lru_.rbegin(), lru_.rend()};
}

}  // namespace pdserve::kv_tiers
