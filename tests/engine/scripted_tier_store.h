// A KvTierStore for engine tests: it holds the keys the test gives it, and every job it starts
// waits until the test finishes it (an offload's keys are then held).
#pragma once

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/engine/kv_tier.h"

namespace pdserve::testing {

class ScriptedTierStore final : public KvTierStore {
 public:
  uint64_t block_bytes() const override { return 1000; }
  bool holds(uint64_t key) const override { return keys.contains(key); }
  Result<TierJobId> start_offload(std::span<const TierOffload> blocks) override {
    offloads[next_job] = std::vector<TierOffload>(blocks.begin(), blocks.end());
    return next_job++;
  }
  std::vector<KvTier> match(std::span<const TieredBlockId> blocks) override {
    std::vector<KvTier> tiers;
    for (const TieredBlockId& block : blocks) {
      if (!keys.contains(block.key)) break;
      tiers.push_back(KvTier::kHost);
    }
    return tiers;
  }
  Result<TierJobId> start_reload(std::span<const TierReload> blocks) override {
    reloads[next_job] = std::vector<TierReload>(blocks.begin(), blocks.end());
    return next_job++;
  }
  std::vector<TierJobResult> poll() override { return std::exchange(finished, {}); }
  bool busy() const override { return !offloads.empty() || !reloads.empty(); }
  void set_wakeup(std::function<void()>) override {}
  KvTierStats stats() const override { return {}; }
  PrefixCacheChanges take_tiered_changes() override { return {}; }
  void restore_tiered_changes(const PrefixCacheChanges&) override {}
  void resync_tiered_keys() override {}

  void finish(TierJobId job, Status status = Status::ok_status()) {
    int blocks = 0;
    if (auto it = offloads.find(job); it != offloads.end()) {
      blocks = static_cast<int>(it->second.size());
      if (status.ok()) {
        for (const TierOffload& block : it->second) keys.insert(block.id.key);
      }
      offloads.erase(it);
    } else {
      blocks = static_cast<int>(reloads.at(job).size());
      reloads.erase(job);
    }
    finished.push_back({job, status, blocks, blocks, 0, blocks * block_bytes(), 0.001});
  }

  std::set<uint64_t> keys;
  std::map<TierJobId, std::vector<TierOffload>> offloads;
  std::map<TierJobId, std::vector<TierReload>> reloads;
  std::vector<TierJobResult> finished;
  TierJobId next_job = 1;
};

}  // namespace pdserve::testing
