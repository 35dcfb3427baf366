// A node's journals of prefix-cache keys as the feeds its heartbeats read (through a
// PrefixCacheFanout, one stream per proxy): the engine's pool, and the tier store's lower KV
// tiers (issue #32). Each journal is its owner's, bounded and resynced there; a feed only turns
// its changes into reports labelled with the engine's block size, and reports back into changes.
#pragma once

#include "common/cluster/node_agent.h"
#include "common/engine/llm_engine.h"
#include "common/engine/tiered_key_source.h"

namespace pdserve {

// `engine` must outlive the feed.
PrefixCacheFeed prefix_cache_feed(LlmEngine* engine, int block_size);
// `tiers` must outlive the feed.
PrefixCacheFeed tiered_cache_feed(TieredKeySource* tiers, int block_size);

}  // namespace pdserve
