// A node's membership in a cluster served by several pdserve-proxy replicas: one NodeAgent per
// proxy, each registering and heartbeating on its own thread with its own deadlines, so a dead
// or slow proxy never delays the heartbeats to the others, and each proxy's registration (its
// id for the node, 404s, restarts) is independent. The agents share one drain flag: a drain at
// any proxy drains the node at every proxy (node_agent.h), and on_retired runs once, when the
// last agent has stopped for good. With one proxy this is one NodeAgent.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cluster/cluster_messages.h"
#include "common/cluster/node_agent.h"
#include "common/core/status.h"

namespace pdserve {

struct MembershipOptions {
  std::vector<std::string> proxy_urls;  // http://HOST:PORT each, at least one, no repeats
  std::string cluster_token;
  NodeRegistration registration;
  std::chrono::milliseconds heartbeat_interval{1'000};
  // Called once, on the last agent's thread, when every proxy retired the node after a drain
  // (or, the node draining, no longer knows it or cannot be reached).
  std::function<void()> on_retired;
  // The prefix-cache feed of the agent of proxy_urls[i] (each proxy needs its own stream of
  // changes); empty: heartbeats carry no report.
  std::function<PrefixCacheFeed(size_t proxy_index)> prefix_cache;
  // The same for the keys in the node's lower KV tiers; empty: the node has none.
  std::function<PrefixCacheFeed(size_t proxy_index)> tiered_cache;
};

class ClusterMembership {
 public:
  // InvalidArgument for no proxy, a repeated one, or what NodeAgent::start refuses.
  static Result<std::unique_ptr<ClusterMembership>> start(MembershipOptions options,
                                                          std::function<NodeLoad()> load);
  // Every agent leaves its proxy, all at once (each DELETE within its own deadline).
  ~ClusterMembership();
  ClusterMembership(const ClusterMembership&) = delete;
  ClusterMembership& operator=(const ClusterMembership&) = delete;

  // A proxy drained the node: no new work comes from any proxy.
  bool draining() const { return draining_->load(); }
  // Every agent has stopped for good.
  bool retired() const;
  // The agent of proxy_urls[index].
  const NodeAgent& agent(size_t index) const { return *agents_.at(index); }
  size_t proxies() const { return agents_.size(); }

 private:
  ClusterMembership(std::function<void()> on_retired, size_t proxies)
      : on_retired_(std::move(on_retired)), proxies_(proxies) {}
  void agent_stopped();

  std::function<void()> on_retired_;
  size_t proxies_;  // agents started or to be started
  std::shared_ptr<std::atomic<bool>> draining_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mutex_;
  size_t stopped_ = 0;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
};

}  // namespace pdserve
