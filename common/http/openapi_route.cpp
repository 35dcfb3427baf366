#include "common/http/openapi_route.h"

#include <utility>

namespace pdserve::http {

void add_openapi_route(RouteTable& routes, std::function<OpenApiFacts()> facts) {
  auto operations = routes.routes();
  operations.emplace_back("GET", "/openapi.json");
  routes.add("GET", "/openapi.json",
             [operations = std::move(operations), facts = std::move(facts)](
                 const HttpRequest&, std::shared_ptr<ResponseChannel> channel) {
               channel->send({200, "application/json", {},
                              openapi_document(operations, facts()).dump()});
             });
}

}  // namespace pdserve::http
