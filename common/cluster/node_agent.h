// A node's membership in one proxy's cluster: registers the node (POST /cluster/nodes with its
// role, HTTP address, model, KV descriptor and capacity), then sends its load as a heartbeat
// every interval, on a fixed cadence, each call bounded by the interval (POST
// /cluster/nodes/ID/heartbeat): a heartbeat lost on the network does not hold up the next one.
// When the proxy forgets it (404: the proxy
// restarted, or dropped the node after missed heartbeats) it registers again; when the proxy
// is unreachable it keeps retrying. When the proxy drains the node its heartbeat answers say
// "draining"; once the node's requests are done the proxy retires the id (410 Gone): the
// agent then stops for good, without registering again, and calls on_retired. On destruction
// it leaves (DELETE /cluster/nodes/ID) unless it was retired. With a prefix-cache feed each
// heartbeat carries what changed in the node's prefix cache (cache-aware routing); changes
// whose heartbeat got no 200 are given back to be sent again, and after each registration the
// feed is asked for a snapshot, since the proxy knows nothing of a node it has just registered.
// A node with KV tiers has a second feed of the same kind for the keys in its lower tiers
// (Heartbeat::tiered_cache), handled by the same rules.
//
// A node registered with several proxies runs one agent per proxy (cluster_membership.h), all
// sharing one drain flag: a drain at any proxy sets it, and from then on every agent's
// heartbeats say "draining" (that proxy drains the node too) and an agent whose proxy does not
// know the node or cannot be reached stops as well (kLeft) instead of registering again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/cluster/cluster_messages.h"
#include "common/core/status.h"
#include "common/http/http_client.h"

namespace pdserve {

// The node's prefix cache as the agent sees it; every function is called on the agent's thread.
struct PrefixCacheFeed {
  std::function<std::optional<PrefixCacheReport>()> take;  // the changes since the last take
  // Changes taken earlier whose heartbeat may not have arrived; later changes win over them.
  std::function<void(PrefixCacheReport)> restore;
  std::function<void()> resync;  // the next take is a snapshot of the whole cache
};

struct NodeAgentOptions {
  std::string proxy_url;  // http://HOST:PORT
  std::string cluster_token;
  NodeRegistration registration;  // what the node tells the proxy of itself
  std::chrono::milliseconds heartbeat_interval{1'000};
  // Called once on the agent's thread when it stopped for good (kRetired or kLeft).
  std::function<void()> on_retired;
  std::optional<PrefixCacheFeed> prefix_cache;  // none: heartbeats carry no report
  std::optional<PrefixCacheFeed> tiered_cache;  // none (no KV tiers): no tiered report
  // Set when any proxy drains the node; shared by the node's agents (null: the agent's own).
  std::shared_ptr<std::atomic<bool>> node_draining;
};

// kUnregistered -> kRegistered (200 to the registration) -> kUnregistered (404: the proxy
// forgot the node) ... and, once stopped for good: kRetired (410: the proxy retired the node
// after its drain) or kLeft (the node is draining and this proxy does not know it or cannot be
// reached: nothing to wait for there).
enum class AgentState { kUnregistered, kRegistered, kRetired, kLeft };

class NodeAgent {
 public:
  // `load` is called on the agent's thread for each heartbeat.
  static Result<std::unique_ptr<NodeAgent>> start(NodeAgentOptions options,
                                                  std::function<NodeLoad()> load);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // The id the proxy gave this node; empty while unregistered, and once the proxy retired or
  // forgot it (kLeft for an unanswered proxy keeps it, for the DELETE on destruction).
  std::string node_id() const;
  // The node drains (this or another proxy of the shared flag asked it to): no new work comes.
  bool draining() const;
  // The agent has stopped for good (kRetired or kLeft).
  bool retired() const;
  AgentState state() const;

 private:
  NodeAgent(NodeAgentOptions options, http::BaseUrl proxy, std::function<NodeLoad()> load,
            std::unique_ptr<http::HttpClient> client);
  void run();
  void register_node();
  void send_heartbeat();
  // Every feed's next take is a snapshot (the proxy knows nothing of the node, or refused a report).
  void resync_feeds();
  // The heartbeat answer's consequences: a new state, the drain flag.
  void on_heartbeat_answer(const Result<http::ClientResponse>& response);

  NodeAgentOptions options_;
  http::BaseUrl proxy_;
  std::function<NodeLoad()> load_;
  std::unique_ptr<http::HttpClient> client_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string node_id_;
  AgentState state_ = AgentState::kUnregistered;
  bool stopping_ = false;
  bool warned_unreachable_ = false;
  std::thread thread_;
};

}  // namespace pdserve
