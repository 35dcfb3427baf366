#include "common/cluster/node_agent.h"

#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/json_depth.h"
#include "common/core/log.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

constexpr auto kCallTimeout = std::chrono::seconds(2);

}  // namespace

Result<std::unique_ptr<NodeAgent>> NodeAgent::start(NodeAgentOptions options,
                                                    std::function<nlohmann::json()> load) {
  PDS_ASSIGN_OR_RETURN(http::BaseUrl proxy, http::parse_base_url(options.proxy_url));
  if (options.role != "prefill" && options.role != "decode") {
    return invalid_argument("node role must be prefill or decode, got '" + options.role + "'");
  }
  if (options.heartbeat_interval.count() < 1) {
    return invalid_argument("the heartbeat interval must be >= 1 ms");
  }
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
                     std::function<nlohmann::json()> load, std::unique_ptr<http::HttpClient> client)
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
    request.headers.emplace_back("Authorization",
                                 cluster_auth_header_value(options_.cluster_token));
    request.timeout = kCallTimeout;
    (void)client_->fetch_and_wait(proxy_, std::move(request));
  }
}

std::string NodeAgent::node_id() const {
  std::lock_guard lock(mutex_);
  return node_id_;
}

bool NodeAgent::draining() const {
  std::lock_guard lock(mutex_);
  return draining_;
}

bool NodeAgent::retired() const {
  std::lock_guard lock(mutex_);
  return retired_;
}

void NodeAgent::run() {
  for (;;) {
    if (node_id().empty()) {
      register_node();
    } else {
      send_heartbeat();
    }
    if (retired()) {
      if (options_.on_retired) options_.on_retired();
      return;
    }
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, options_.heartbeat_interval, [this] { return stopping_; });
    if (stopping_) return;
  }
}

void NodeAgent::register_node() {
  http::ClientRequest request;
  request.method = "POST";
  request.target = "/cluster/nodes";
  request.headers.emplace_back("Authorization", cluster_auth_header_value(options_.cluster_token));
  request.timeout = kCallTimeout;
  request.body = Json{{"role", options_.role},
                      {"url", options_.http_url},
                      {"model", options_.model},
                      {"kv_descriptor", options_.kv_descriptor},
                      {"kv_blocks_total", options_.kv_blocks_total}}
                     .dump();
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
  if (!body.ok() || !body->is_object() || !body->contains("id") || !(*body)["id"].is_string()) {
    PDS_LOG_WARN("the proxy's registration answer has no id: " + response->body.substr(0, 300));
    return;
  }
  warned_unreachable_ = false;
  std::lock_guard lock(mutex_);
  node_id_ = (*body)["id"].get<std::string>();
  PDS_LOG_INFO("registered with the proxy at " + proxy_.to_string() + " as " + node_id_);
}

void NodeAgent::send_heartbeat() {
  http::ClientRequest request;
  request.method = "POST";
  request.target = "/cluster/nodes/" + node_id() + "/heartbeat";
  request.headers.emplace_back("Authorization", cluster_auth_header_value(options_.cluster_token));
  request.timeout = kCallTimeout;
  request.body = Json{{"load", load_ ? load_() : Json::object()}}.dump();
  Result<http::ClientResponse> response = client_->fetch_and_wait(proxy_, std::move(request));
  if (!response.ok()) return;
  if (response->status == 404) {
    PDS_LOG_WARN("the proxy no longer knows node " + node_id() + "; registering again");
    std::lock_guard lock(mutex_);
    node_id_.clear();
  } else if (response->status == 410) {
    PDS_LOG_INFO("the proxy retired node " + node_id() + " after draining it; leaving the cluster");
    std::lock_guard lock(mutex_);
    node_id_.clear();  // nothing to DELETE: the proxy already forgot it
    retired_ = true;
  } else if (response->status == 200) {
    const Result<Json> body = parse_json_bounded(response->body, "the proxy's heartbeat answer");
    const bool draining =
        body.ok() && body->is_object() && body->value("state", Json()) == "draining";
    std::lock_guard lock(mutex_);
    if (draining && !draining_) PDS_LOG_INFO("the proxy is draining node " + node_id_);
    draining_ = draining;
  }
}

}  // namespace pdserve
