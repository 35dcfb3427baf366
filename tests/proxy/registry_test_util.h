// What the NodeRegistry tests share: options with a 1 s heartbeat timeout, and a node's
// registration (model "m", 100 KV blocks) on a loopback port.
#pragma once

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "proxy/routing/node_registry.h"

namespace pdserve::proxy::testing {

inline RegistryOptions test_options() {
  RegistryOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(1'000);
  options.static_down_cooldown = std::chrono::milliseconds(500);
  return options;
}

inline nlohmann::json registration(const std::string& role, int port) {
  return {{"role", role},
          {"url", "http://127.0.0.1:" + std::to_string(port)},
          {"model", "m"},
          {"kv_descriptor", "abc"},
          {"kv_blocks_total", 100}};
}

// Registers a node; its id, or "" (and a test failure) when refused.
inline std::string must_register(NodeRegistry& registry, const std::string& role, int port,
                                 NodeRegistry::Clock::time_point now) {
  Result<std::string> id = registry.register_node(registration(role, port), now);
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  return id.ok() ? *id : std::string();
}

}  // namespace pdserve::proxy::testing
