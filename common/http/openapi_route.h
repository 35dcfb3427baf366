// GET /openapi.json: the public operations of the routes registered so far, described by
// common/protocol/openapi.json. Register it last.
#pragma once

#include <functional>

#include "common/http/route_table.h"
#include "common/protocol/openapi.h"

namespace pdserve::http {

// `facts` is asked on every request (a proxy learns its model names as nodes register).
void add_openapi_route(RouteTable& routes, std::function<OpenApiFacts()> facts);

}  // namespace pdserve::http
