#include "common/cluster/cluster_membership.h"

#include <set>
#include <thread>
#include <utility>

#include "common/http/http_client.h"

namespace pdserve {

Result<std::unique_ptr<ClusterMembership>> ClusterMembership::start(
    MembershipOptions options, std::function<NodeLoad()> load) {
  if (options.proxy_urls.empty()) return invalid_argument("a node needs at least one proxy");
  std::set<std::string> seen;
  for (const std::string& url : options.proxy_urls) {
    PDS_ASSIGN_OR_RETURN(const http::BaseUrl base, http::parse_base_url(url));
    if (!seen.insert(base.to_string()).second) {
      return invalid_argument("proxy " + url + " is named twice (its heartbeats would count twice)");
    }
  }
  std::unique_ptr<ClusterMembership> membership(
      new ClusterMembership(std::move(options.on_retired), options.proxy_urls.size()));
  ClusterMembership* raw = membership.get();
  for (size_t index = 0; index < options.proxy_urls.size(); ++index) {
    NodeAgentOptions agent;
    agent.proxy_url = options.proxy_urls[index];
    agent.cluster_token = options.cluster_token;
    agent.registration = options.registration;
    agent.heartbeat_interval = options.heartbeat_interval;
    agent.on_retired = [raw] { raw->agent_stopped(); };
    if (options.prefix_cache) agent.prefix_cache = options.prefix_cache(index);
    if (options.tiered_cache) agent.tiered_cache = options.tiered_cache(index);
    agent.node_draining = membership->draining_;
    // On failure the agents already started leave with `membership`.
    PDS_ASSIGN_OR_RETURN(std::unique_ptr<NodeAgent> started, NodeAgent::start(agent, load));
    membership->agents_.push_back(std::move(started));
  }
  return membership;
}

ClusterMembership::~ClusterMembership() {
  // Each agent's DELETE has its own deadline; side by side, a dead proxy delays no other.
  std::vector<std::thread> leaving;
  for (std::unique_ptr<NodeAgent>& agent : agents_) {
    const Status started = capture_status([&] {
      leaving.emplace_back([&agent] { agent.reset(); });
      return Status::ok_status();
    });
    if (!started.ok()) agent.reset();
  }
  for (std::thread& thread : leaving) thread.join();
}

bool ClusterMembership::retired() const {
  for (const std::unique_ptr<NodeAgent>& agent : agents_) {
    if (agent == nullptr || !agent->retired()) return false;
  }
  return !agents_.empty();
}

void ClusterMembership::agent_stopped() {
  {
    std::lock_guard lock(mutex_);
    if (++stopped_ < proxies_) return;
  }
  if (on_retired_) on_retired_();
}

}  // namespace pdserve
