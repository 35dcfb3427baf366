// The probes and the version every server answers, open to all (no key):
//   GET /health           liveness: 200 {} while the process serves HTTP
//   GET /ready            readiness: 200 {"ready": true}, or 503 with an OpenAI error body that
//   GET /health?ready=1   says what is missing (a load balancer sends no traffic until 200)
//   GET /version          {"version": "<pdserve version>"} (vLLM's shape)
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/http/route_table.h"

namespace pdserve::http {

// Why the server is not ready, or nullopt when it is. Asked on every readiness probe, on an
// I/O thread: it must be quick.
using ReadinessProbe = std::function<std::optional<std::string>()>;

// The answer to GET /health (liveness, or readiness with ?ready=1 or ?ready=true) and GET
// /ready (`readiness`).
HttpResponse health_response(const HttpRequest& request, const ReadinessProbe& probe,
                             bool readiness);
// GET /health, GET /ready and GET /version. `on_answer` (optional) sees each status sent.
void add_service_routes(RouteTable& routes, ReadinessProbe probe,
                        std::function<void(int status)> on_answer = {});

// The project version (CMake's PROJECT_VERSION).
const char* pdserve_version();

}  // namespace pdserve::http
