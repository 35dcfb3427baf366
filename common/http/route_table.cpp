#include "common/http/route_table.h"

#include <utility>

namespace pdserve::http {

void RouteTable::add(std::string method, std::string path, Handler handler) {
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

void RouteTable::add_prefix(std::string method, std::string prefix, Handler handler) {
  prefix_routes_[std::move(prefix)][std::move(method)] = std::move(handler);
}

RouteMatch RouteTable::match(std::string_view method, std::string_view path) const {
  RouteMatch result;
  auto route = routes_.find(path);
  if (route == routes_.end()) {
    route = prefix_routes_.end();
    size_t longest = 0;
    for (auto it = prefix_routes_.begin(); it != prefix_routes_.end(); ++it) {
      if (path.starts_with(it->first) && it->first.size() >= longest) {
        longest = it->first.size();
        route = it;
      }
    }
    if (route == prefix_routes_.end()) return result;
  }
  for (const auto& [route_method, handler] : route->second) {
    if (route_method == method) result.handler = &handler;
    result.allowed.push_back(route_method);
  }
  return result;
}

std::vector<std::pair<std::string, std::string>> RouteTable::routes() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [path, methods] : routes_) {
    for (const auto& [method, handler] : methods) out.emplace_back(method, path);
  }
  for (const auto& [prefix, methods] : prefix_routes_) {
    for (const auto& [method, handler] : methods) out.emplace_back(method, prefix);
  }
  return out;
}

}  // namespace pdserve::http
