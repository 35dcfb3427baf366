// A node's membership in a proxy's cluster: registers the node (POST /cluster/nodes with its
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
#pragma once

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
  // Called once on the agent's thread when the proxy retired this node after a drain.
  std::function<void()> on_retired;
  std::optional<PrefixCacheFeed> prefix_cache;  // none: heartbeats carry no report
};

class NodeAgent {
 public:
  // `load` is called on the agent's thread for each heartbeat.
  static Result<std::unique_ptr<NodeAgent>> start(NodeAgentOptions options,
                                                  std::function<NodeLoad()> load);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // The id the proxy gave this node; empty while unregistered and after retirement.
  std::string node_id() const;
  // The proxy asked this node to drain (no new work comes).
  bool draining() const;
  // The proxy retired this node after a drain; the agent has stopped.
  bool retired() const;

 private:
  NodeAgent(NodeAgentOptions options, http::BaseUrl proxy, std::function<NodeLoad()> load,
            std::unique_ptr<http::HttpClient> client);
  void run();
  void register_node();
  void send_heartbeat();

  NodeAgentOptions options_;
  http::BaseUrl proxy_;
  std::function<NodeLoad()> load_;
  std::unique_ptr<http::HttpClient> client_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string node_id_;
  bool stopping_ = false;
  bool draining_ = false;
  bool retired_ = false;
  bool warned_unreachable_ = false;
  std::thread thread_;
};

}  // namespace pdserve
