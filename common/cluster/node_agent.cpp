#include "common/cluster/node_agent.h"

#include <algorithm>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/json_depth.h"
#include "common/core/log.h"
#include "common/protocol/pdserve_headers.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

constexpr auto kCallTimeout = std::chrono::seconds(2);

// A heartbeat that gets no answer must not delay the next one past the proxy's expiry (3 s
// by default): each call is bounded by the interval (within [100 ms, 2 s]) and calls start on a
// fixed cadence, so one lost heartbeat leaves a gap of about two intervals.
std::chrono::milliseconds heartbeat_call_timeout(std::chrono::milliseconds interval) {
  return std::clamp<std::chrono::milliseconds>(interval, std::chrono::milliseconds(100),
                                               kCallTimeout);
}

}  // namespace

Result<std::unique_ptr<NodeAgent>> NodeAgent::start(NodeAgentOptions options,
                                                    std::function<NodeLoad()> load) {
  PDS_ASSIGN_OR_RETURN(http::BaseUrl proxy, http::parse_base_url(options.proxy_url));
  // What the proxy would refuse, refused here (a bad URL, a negative capacity).
  PDS_RETURN_IF_ERROR(NodeRegistration::parse(options.registration.to_json()).status());
  if (options.heartbeat_interval.count() < 1) {
    return invalid_argument("the heartbeat interval must be >= 1 ms");
  }
  if (!options.node_draining) options.node_draining = std::make_shared<std::atomic<bool>>(false);
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpClient> client, http::HttpClient::create(1));
  std::unique_ptr<NodeAgent> agent(
      new NodeAgent(std::move(options), std::move(proxy), std::move(load), std::move(client)));
  NodeAgent* raw = agent.get();
  PDS_RETURN_IF_ERROR(capture_status([&] {
    raw->thread_ = std::thread([raw] { raw->run(); });
    return Status::ok_status();
  }));
  return agent;
}

NodeAgent::NodeAgent(NodeAgentOptions options, http::BaseUrl proxy,
                     std::function<NodeLoad()> load, std::unique_ptr<http::HttpClient> client)
    : options_(std::move(options)),
      proxy_(std::move(proxy)),
      load_(std::move(load)),
      client_(std::move(client)) {}

NodeAgent::~NodeAgent() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  const std::string id = node_id();
  if (!id.empty()) {
    http::ClientRequest request;
    request.method = "DELETE";
    request.target = "/cluster/nodes/" + id;
    request.headers.emplace_back(std::string(kAuthorizationHeader),
                                 cluster_auth_header_value(options_.cluster_token));
    request.timeout = kCallTimeout;
    (void)client_->fetch_and_wait(proxy_, std::move(request));
  }
}

std::string NodeAgent::node_id() const {
  std::lock_guard lock(mutex_);
  return node_id_;
}

bool NodeAgent::draining() const { return options_.node_draining->load(); }

bool NodeAgent::retired() const {
  const AgentState current = state();
  return current == AgentState::kRetired || current == AgentState::kLeft;
}

AgentState NodeAgent::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

void NodeAgent::run() {
  for (;;) {
    const auto tick = std::chrono::steady_clock::now();
    if (state() == AgentState::kUnregistered) {
      if (draining()) {
        // A draining node joins no proxy: this one sends it nothing to wait for.
        std::lock_guard lock(mutex_);
        state_ = AgentState::kLeft;
      } else {
        register_node();
      }
    } else {
      send_heartbeat();
    }
    if (retired()) {
      if (options_.on_retired) options_.on_retired();
      return;
    }
    std::unique_lock lock(mutex_);
    wake_.wait_until(lock, tick + options_.heartbeat_interval, [this] { return stopping_; });
    if (stopping_) return;
  }
}

void NodeAgent::register_node() {
  http::ClientRequest request;
  request.method = "POST";
  request.target = "/cluster/nodes";
  request.headers.emplace_back(std::string(kAuthorizationHeader), cluster_auth_header_value(options_.cluster_token));
  request.timeout = kCallTimeout;
  request.body = options_.registration.to_json().dump();
  Result<http::ClientResponse> response = client_->fetch_and_wait(proxy_, std::move(request));
  if (!response.ok() || response->status != 200) {
    if (!warned_unreachable_) {
      PDS_LOG_WARN("cannot register with the proxy at " + proxy_.to_string() + ": " +
                   (response.ok() ? "HTTP " + std::to_string(response->status) + " " +
                                        response->body.substr(0, 300)
                                  : response.status().message()) +
                   " (retrying every heartbeat)");
      warned_unreachable_ = true;
    }
    return;
  }
  const Result<Json> body = parse_json_bounded(response->body, "the proxy's registration answer");
  const Result<RegistrationReply> reply =
      body.ok() ? RegistrationReply::parse(*body) : Result<RegistrationReply>(body.status());
  if (!reply.ok()) {
    PDS_LOG_WARN(reply.status().message() + ": " + response->body.substr(0, 300));
    return;
  }
  warned_unreachable_ = false;
  resync_feeds();
  std::lock_guard lock(mutex_);
  node_id_ = reply->id;
  state_ = AgentState::kRegistered;
  PDS_LOG_INFO("registered with the proxy at " + proxy_.to_string() + " as " + node_id_);
}

void NodeAgent::send_heartbeat() {
  http::ClientRequest request;
  request.method = "POST";
  request.target = "/cluster/nodes/" + node_id() + "/heartbeat";
  request.headers.emplace_back(std::string(kAuthorizationHeader), cluster_auth_header_value(options_.cluster_token));
  request.timeout = heartbeat_call_timeout(options_.heartbeat_interval);
  Heartbeat heartbeat;
  if (load_) heartbeat.load = load_();
  if (options_.prefix_cache) heartbeat.prefix_cache = options_.prefix_cache->take();
  if (options_.tiered_cache) heartbeat.tiered_cache = options_.tiered_cache->take();
  heartbeat.draining = draining();
  request.body = heartbeat.to_json().dump();
  Result<http::ClientResponse> response = client_->fetch_and_wait(proxy_, std::move(request));
  const bool reported = heartbeat.prefix_cache || heartbeat.tiered_cache;
  if (reported && response.ok() && response->status == 400) {
    // The proxy refused a report itself: sending it again would not help, a snapshot may.
    PDS_LOG_WARN("the proxy refused a heartbeat: " + response->body.substr(0, 300));
    resync_feeds();
  } else if (!response.ok() ||
             (response->status != 200 && response->status != 404 && response->status != 410)) {
    // Lost or unanswered: the changes go back to be sent again (a 404 or 410 needs none: a new
    // registration asks for snapshots, a retired node reports nothing).
    if (heartbeat.prefix_cache) options_.prefix_cache->restore(std::move(*heartbeat.prefix_cache));
    if (heartbeat.tiered_cache) options_.tiered_cache->restore(std::move(*heartbeat.tiered_cache));
  }
  on_heartbeat_answer(response);
}

void NodeAgent::resync_feeds() {
  if (options_.prefix_cache) options_.prefix_cache->resync();
  if (options_.tiered_cache) options_.tiered_cache->resync();
}

void NodeAgent::on_heartbeat_answer(const Result<http::ClientResponse>& response) {
  const std::string id = node_id();
  if (!response.ok() || (response->status != 200 && response->status != 404 &&
                         response->status != 410)) {
    if (draining()) {
      // Drained elsewhere: a proxy that cannot be reached routes nothing here to wait for.
      PDS_LOG_INFO("the proxy at " + proxy_.to_string() + " does not answer while node " + id +
                   " drains; leaving it");
      std::lock_guard lock(mutex_);
      state_ = AgentState::kLeft;  // keeps the id: the DELETE on destruction is still tried
    }
    return;
  }
  if (response->status == 404) {
    std::lock_guard lock(mutex_);
    node_id_.clear();
    if (draining()) {
      PDS_LOG_INFO("the proxy at " + proxy_.to_string() + " no longer knows draining node " + id +
                   "; leaving it");
      state_ = AgentState::kLeft;
    } else {
      PDS_LOG_WARN("the proxy no longer knows node " + id + "; registering again");
      state_ = AgentState::kUnregistered;
    }
  } else if (response->status == 410) {
    PDS_LOG_INFO("the proxy retired node " + id + " after draining it; leaving the cluster");
    std::lock_guard lock(mutex_);
    node_id_.clear();  // nothing to DELETE: the proxy already forgot it
    state_ = AgentState::kRetired;
  } else {
    const Result<Json> body = parse_json_bounded(response->body, "the proxy's heartbeat answer");
    const Result<HeartbeatReply> reply =
        body.ok() ? HeartbeatReply::parse(*body) : Result<HeartbeatReply>(body.status());
    if (reply.ok() && reply->state == NodeState::kDraining &&
        !options_.node_draining->exchange(true)) {
      PDS_LOG_INFO("the proxy at " + proxy_.to_string() + " is draining node " + id);
    }
  }
}

}  // namespace pdserve
