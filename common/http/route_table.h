// Maps (method, exact path) to a handler. An unknown path is a 404; a known path asked with
// another method is a 405 that lists the allowed methods.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/http/http_message.h"
#include "common/http/response_channel.h"

namespace pdserve::http {

// Handlers run on an I/O thread and must return quickly; slow work answers later through the
// channel from any thread. An exception escaping a handler becomes a 500.
using Handler = std::function<void(const HttpRequest&, std::shared_ptr<ResponseChannel>)>;

struct RouteMatch {
  const Handler* handler = nullptr;  // null when nothing matched
  std::vector<std::string> allowed;  // the path's methods, when the path is known
};

class RouteTable {
 public:
  void add(std::string method, std::string path, Handler handler);
  // Every path that starts with `prefix` (e.g. "/cluster/nodes/" for "/cluster/nodes/ID/drain")
  // and has no exact route; the handler parses the rest of the path. The longest prefix wins.
  void add_prefix(std::string method, std::string prefix, Handler handler);
  RouteMatch match(std::string_view method, std::string_view path) const;
  // Every exact route as (method, path), sorted, then every prefix route as (method, prefix):
  // what the server answers (GET /openapi.json describes the public ones).
  std::vector<std::pair<std::string, std::string>> routes() const;

 private:
  // path -> method -> handler
  std::map<std::string, std::map<std::string, Handler>, std::less<>> routes_;
  std::map<std::string, std::map<std::string, Handler>, std::less<>> prefix_routes_;
};

}  // namespace pdserve::http
