#include "common/http/router.h"

#include <utility>

namespace pdserve::http {

void Router::add(std::string method, std::string path, Handler handler) {
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

RouteMatch Router::match(std::string_view method, std::string_view path) const {
  RouteMatch result;
  const auto route = routes_.find(path);
  if (route == routes_.end()) return result;
  for (const auto& [route_method, handler] : route->second) {
    if (route_method == method) result.handler = &handler;
    result.allowed.push_back(route_method);
  }
  return result;
}

}  // namespace pdserve::http
