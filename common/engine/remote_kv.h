// The plain data a request carries when its KV crosses nodes (see kv_connector.h): where a
// prefill node sends it, where a decode node fetches it from, and how a transfer went.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

// What the sender learns about one export, for its caller (the prefill node's HTTP answer).
struct KvTransferReport {
  Status status;
  uint64_t bytes = 0;
  int blocks = 0;
  double seconds = 0;         // from the start of the puts to the receiver's acknowledgement
  int layers = 0;             // layers sent
  int layers_overlapped = 0;  // of them, sent while the prefill's forward was still running
  // When the target asked for them and the transfer succeeded: one checksum per sent block.
  std::vector<uint64_t> block_checksums{};
  // Failed before anything was put because the receiver's descriptor was refused: unreadable,
  // denied by the receiver itself (its pool is not the one named), or naming blocks outside
  // that pool (issue #34).
  bool refused = false;
};

// Where a prefilled request's KV goes (set by the prefill node's front end).
struct KvExportTarget {
  std::string peer_descriptor;       // the receiver's transfer descriptor (opaque bytes)
  int peer_num_blocks = 0;           // the receiver pool's size in blocks (its layout)
  std::vector<int32_t> peer_blocks;  // receiver block ids for prompt blocks first_block..
  int first_block = 0;               // prompt blocks before it are already on the receiver
  uint64_t transfer_tag = 0;         // the receiver's name for this transfer
  std::chrono::milliseconds timeout{30'000};
  bool checksum = false;  // the receiver verifies the blocks: report a checksum of each
  // Called once, from the connector's thread, when the transfer is done or failed.
  std::function<void(const KvTransferReport&)> on_finished;
  // Called once, on the engine's thread, when the export has started: on_finished follows, and
  // until it does a put may still land in the receiver's blocks. Not called when the export
  // was refused.
  std::function<void()> on_started;
};

// One span of a node's work for the per-request timeline (docs/TRACING.md), in ms after
// that node's receipt of the request; args are numeric.
struct TimelineSpan {
  std::string name;
  double start_ms = 0;
  double end_ms = 0;
  std::vector<std::pair<std::string, double>> args;

  bool operator==(const TimelineSpan&) const = default;
};

// How an imported request's remote prefill went, for latency accounting and its timeline.
struct RemotePrefillStats {
  std::string prefill_url;
  int remote_cached_tokens = 0;  // prompt tokens the prefill node took from its prefix cache
  int local_cached_tokens = 0;   // prompt blocks' tokens already here (not transferred)
  double queue_seconds = 0;      // waiting on the prefill node
  double compute_seconds = 0;    // its forward steps up to the first token
  uint64_t transfer_bytes = 0;
  int transfer_blocks = 0;
  double transfer_seconds = 0;
  int transfer_layers = 0;
  int transfer_layers_overlapped = 0;
  // The exchange on this node's clock, for the clock alignment: the work was POSTed, the
  // answer's head arrived, the first_token event arrived.
  std::chrono::steady_clock::time_point work_posted{};
  std::chrono::steady_clock::time_point head_received{};
  std::chrono::steady_clock::time_point first_token_received{};
  // Landed KV whose checksums did not match, and how many times it was then fetched again
  // from the next prefill node.
  int checksum_mismatches = 0;
  int refetches = 0;
  double head_sent_ms = 0;          // the prefill node sent its head, ms after its receipt
  std::vector<TimelineSpan> spans;  // the prefill node's, ms after its receipt of the work
};

// Where an imported request's prompt is prefilled (set by the decode node's front end).
struct KvImportSource {
  std::vector<std::string> prefill_urls;  // tried in order
  // For the first token (prefill queue + compute); the KV then has its transfer timeout.
  std::chrono::milliseconds prefill_timeout{120'000};
  std::string traceparent;  // W3C, sent with the work (the decode node's child span)
};

}  // namespace pdserve
